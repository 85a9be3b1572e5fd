package throttle

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// clock is a manual clock for the limiters.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func key(s string) Key { return KeyOfString(s) }

func TestKeyGroupsIPv6By64AndIgnoresPortsAndZones(t *testing.T) {
	require.Equal(t, key("192.0.2.1:1000"), key("192.0.2.1:2000"))
	require.Equal(t, key("192.0.2.1"), key("[::ffff:192.0.2.1]:80"), "an IPv4-mapped address is its IPv4 address")
	require.NotEqual(t, key("192.0.2.1:1"), key("192.0.2.2:1"))
	require.Equal(t, "192.0.2.1", key("192.0.2.1:1").String())

	require.Equal(t, key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:2:ffff::9]:2"), "one /64")
	require.NotEqual(t, key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:3::1]:1"))
	require.Equal(t, "2001:db8:1:2::/64", key("2001:db8:1:2::1").String())
	require.Equal(t, key("[fe80::1%eth0]:1"), key("[fe80::2]:1"))

	require.Equal(t, key("127.0.0.1:1"), KeyOf(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}))
	require.Equal(t, KeyOfIP(netip.MustParseAddr("2001:db8::1")), KeyOf(&net.TCPAddr{IP: net.ParseIP("2001:db8::7")}))
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	require.True(t, KeyOf(a.RemoteAddr()).IsZero(), "a pipe has no IP address")
	require.True(t, KeyOf(nil).IsZero())
	require.True(t, key("not an address").IsZero())
}

func TestAuthDelaysThenRefusesWithoutChecking(t *testing.T) {
	clk := newClock()
	a := NewAuth(AuthConfig{MaxFailures: 4, Window: time.Minute, Block: 10 * time.Minute,
		Delay: 100 * time.Millisecond, MaxDelay: 250 * time.Millisecond, Now: clk.Now})
	attacker, other := key("192.0.2.1:5"), key("192.0.2.2:5")

	var delays []time.Duration
	for range 4 {
		at, err := a.Begin(attacker)
		require.NoError(t, err)
		delays = append(delays, at.Delay())
		at.Fail()
		clk.Advance(time.Second)
	}
	require.Equal(t, []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond}, delays,
		"no delay before the first failure, then doubling up to MaxDelay")

	_, err := a.Begin(attacker)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "the fourth failure blocks the address")
	require.Equal(t, attacker, refused.Key)
	require.Equal(t, 10*time.Minute-time.Second, refused.RetryAfter)
	require.Contains(t, err.Error(), "too many failed authentications from 192.0.2.1; try again in 9m59s")

	at, err := a.Begin(other)
	require.NoError(t, err, "another address is not affected")
	require.Zero(t, at.Delay())
	at.Done()

	clk.Advance(10 * time.Minute)
	at, err = a.Begin(attacker)
	require.NoError(t, err, "the block ends")
	require.Zero(t, at.Delay(), "and the address starts afresh")
	at.Done()
}

func TestAuthFailuresOutsideTheWindowDoNotBlock(t *testing.T) {
	clk := newClock()
	a := NewAuth(AuthConfig{MaxFailures: 3, Window: time.Minute, Delay: -1, Now: clk.Now})
	k := key("198.51.100.7:1")
	for range 10 {
		for range 2 {
			at, err := a.Begin(k)
			require.NoError(t, err)
			require.Zero(t, at.Delay(), "a negative Delay means none")
			at.Fail()
		}
		clk.Advance(time.Minute)
	}
	a.Flush(true)
	clk.Advance(time.Minute)
	a.Flush(false)
	require.Zero(t, a.Len(), "an address with nothing left to count is forgotten")
}

func TestAuthCountsAttemptsUnderWay(t *testing.T) {
	clk := newClock()
	a := NewAuth(AuthConfig{MaxFailures: 3, Now: clk.Now})
	k := key("203.0.113.9:1")
	var ats []*Attempt
	for range 3 {
		at, err := a.Begin(k)
		require.NoError(t, err)
		ats = append(ats, at)
	}
	_, err := a.Begin(k)
	require.ErrorAs(t, err, new(*RefusedError), "no more tokens checked at once than may fail")
	ats[0].Done()
	ats[0].Fail() // ignored: the attempt has ended
	at, err := a.Begin(k)
	require.NoError(t, err)
	ats[1].Fail()
	ats[2].Fail()
	at.Fail()
	_, err = a.Begin(k)
	require.ErrorAs(t, err, new(*RefusedError), "three failures block")
}

func TestAuthWaitSleepsTheDelayAndHonoursTheContext(t *testing.T) {
	clk := newClock()
	var slept []time.Duration
	a := NewAuth(AuthConfig{Now: clk.Now, Sleep: func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		return ctx.Err()
	}})
	k := key("192.0.2.50:1")
	at, err := a.Begin(k)
	require.NoError(t, err)
	require.NoError(t, at.Wait(context.Background()))
	at.Fail()
	require.Empty(t, slept, "no wait before the first failure")

	at, err = a.Begin(k)
	require.NoError(t, err)
	require.NoError(t, at.Wait(context.Background()))
	require.Equal(t, []time.Duration{DefaultFailureDelay}, slept)
	at.Done()

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	at, err = a.Begin(k)
	require.NoError(t, err)
	require.ErrorIs(t, at.Wait(ctx), context.Canceled)
	at.Fail() // the cancelled wait ended the attempt: not a failure
	for range DefaultMaxFailures - 1 {
		at, err := a.Begin(k)
		require.NoError(t, err)
		at.Fail()
	}
	_, err = a.Begin(k)
	require.ErrorAs(t, err, new(*RefusedError))
}

func TestAuthLogsInAggregate(t *testing.T) {
	clk := newClock()
	core, logs := observer.New(zapcore.InfoLevel)
	a := NewAuth(AuthConfig{MaxFailures: 100, Window: time.Hour, Block: time.Hour, Delay: -1,
		LogInterval: time.Minute, Logger: zap.New(core), Now: clk.Now})
	k := key("192.0.2.1:1")
	fail := func(n int) {
		for range n {
			at, err := a.Begin(k)
			require.NoError(t, err)
			at.Fail()
		}
	}
	fail(50)
	require.Equal(t, 1, logs.Len(), "the first failure is logged at once, the rest wait for the interval")
	a.Flush(false)
	require.Equal(t, 1, logs.Len())
	clk.Advance(time.Minute)
	a.Flush(false)
	lines := logs.TakeAll()
	require.Len(t, lines, 2)
	require.Equal(t, int64(1), lines[0].ContextMap()["failed"])
	require.Equal(t, int64(49), lines[1].ContextMap()["failed"])
	require.Equal(t, "192.0.2.1", lines[1].ContextMap()["remote"])

	fail(50) // reaches 100: blocked, logged at once
	for range 1000 {
		_, err := a.Begin(k)
		require.Error(t, err)
	}
	lines = logs.TakeAll()
	require.Len(t, lines, 1)
	require.Contains(t, lines[0].Message, "blocked")
	require.Equal(t, int64(50), lines[0].ContextMap()["failed"])
	a.Flush(true)
	lines = logs.TakeAll()
	require.Len(t, lines, 1)
	require.Equal(t, int64(1000), lines[0].ContextMap()["refused"])
	require.Contains(t, lines[0].ContextMap(), "blocked_until")
}

func TestAuthMemoryIsBounded(t *testing.T) {
	clk := newClock()
	core, logs := observer.New(zapcore.InfoLevel)
	a := NewAuth(AuthConfig{MaxFailures: 2, MaxKeys: 100, Delay: -1, Logger: zap.New(core), Now: clk.Now})
	for i := range 10000 {
		k := KeyOfIP(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		at, err := a.Begin(k)
		require.NoError(t, err)
		at.Fail()
		require.LessOrEqual(t, a.Len(), 100)
	}
	require.Equal(t, 10000, logs.Len(), "one line per address")

	// A blocked address stays blocked while it keeps trying, whoever else comes.
	blocked := key("192.0.2.1:1")
	for range 2 {
		at, err := a.Begin(blocked)
		require.NoError(t, err)
		at.Fail()
	}
	for i := range 1000 {
		_, err := a.Begin(blocked)
		require.Error(t, err)
		k := KeyOfIP(netip.AddrFrom4([4]byte{11, 0, byte(i >> 8), byte(i)}))
		if at, err := a.Begin(k); err == nil {
			at.Done()
		}
	}
}

func TestAuthIsSafeForConcurrentUse(t *testing.T) {
	a := NewAuth(AuthConfig{MaxFailures: 5, MaxKeys: 8, Delay: -1})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				at, err := a.Begin(key(fmt.Sprintf("10.0.0.%d:1", (g*i)%20)))
				if err != nil {
					continue
				}
				if i%3 == 0 {
					at.Done()
				} else {
					at.Fail()
				}
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			a.Flush(false)
		}
	})
	wg.Wait()
	require.LessOrEqual(t, a.Len(), 8)
}

func TestNilAuthThrottlesNothing(t *testing.T) {
	var a *Auth
	at, err := a.Begin(key("192.0.2.1:1"))
	require.NoError(t, err)
	require.NoError(t, at.Wait(context.Background()))
	at.Fail()
	at.Done()
	a.Flush(true)
	at, err = NewAuth(AuthConfig{}).Begin(Key{})
	require.NoError(t, err, "the zero Key is never throttled")
	require.Nil(t, at)
}

func TestConnsCapsTotalAndPerAddress(t *testing.T) {
	clk := newClock()
	core, logs := observer.New(zapcore.InfoLevel)
	c := NewConns(ConnsConfig{Max: 5, MaxPerKey: 2, What: "test connections", Logger: zap.New(core), Now: clk.Now})
	a, b, d := key("127.0.0.1:1"), key("127.0.0.2:1"), key("127.0.0.3:1")

	a1, a2 := c.Acquire(a), c.Acquire(a)
	require.NotNil(t, a1)
	require.NotNil(t, a2)
	require.Nil(t, c.Acquire(a), "over the per-address cap")
	b1, b2 := c.Acquire(b), c.Acquire(b)
	require.NotNil(t, b1)
	require.NotNil(t, b2)
	p := c.Acquire(Key{})
	require.NotNil(t, p, "a pipe counts toward the total only")
	require.Nil(t, c.Acquire(d), "over the total cap")
	total, fromA := c.Held(a)
	require.Equal(t, 5, total)
	require.Equal(t, 2, fromA)

	a1.Release()
	a1.Release() // only the first counts
	total, fromA = c.Held(a)
	require.Equal(t, 4, total)
	require.Equal(t, 1, fromA)
	require.NotNil(t, c.Acquire(d))
	require.Nil(t, c.Acquire(a), "over the total cap again")
	var nilSlot *Slot
	nilSlot.Release()

	lines := logs.TakeAll()
	require.Len(t, lines, 1, "the first refusal is logged at once, the rest wait for the interval")
	c.Flush(false)
	require.Zero(t, logs.Len())
	clk.Advance(time.Minute)
	c.Flush(false)
	lines = logs.TakeAll()
	require.Len(t, lines, 1)
	require.Equal(t, "refused test connections over the caps", lines[0].Message)
	require.Equal(t, int64(2), lines[0].ContextMap()["over_total_cap"])
	require.Equal(t, int64(0), lines[0].ContextMap()["over_per_address_cap"])
	require.Equal(t, "127.0.0.1", lines[0].ContextMap()["last_remote"])
}
