package webhook

import (
	"crypto/sha256"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPayloadJSONMatchesSeed(t *testing.T) {
	p := Payload{
		Event:        EventGroupZeroHealthy,
		RegionID:     "eu",
		Protocol:     "http",
		Label:        "pool",
		GroupName:    "web",
		KeyHashShort: "deadbeef",
		MemberCount:  2,
		At:           FormatTime(time.Date(2026, 5, 6, 13, 24, 55, 0, time.UTC)),
	}
	got, err := json.Marshal(p)
	require.NoError(t, err)
	// The documented body, field for field and in the same order.
	want := `{"event":"group_zero_healthy","region_id":"eu","protocol":"http",` +
		`"label":"pool","group_name":"web","key_hash_short":"deadbeef",` +
		`"member_count":2,"at":"2026-05-06T13:24:55+00:00"}`
	require.Equal(t, want, string(got))
}

func TestFormatTimeIsUTCAndRFC3339(t *testing.T) {
	loc := time.FixedZone("CEST", 2*60*60)
	at := time.Date(2026, 5, 6, 15, 24, 55, 123, loc)
	s := FormatTime(at)
	require.Equal(t, "2026-05-06T13:24:55+00:00", s)
	back, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	require.True(t, back.Equal(at.Truncate(time.Second)))
}

func TestShortHash(t *testing.T) {
	h := sha256.Sum256([]byte("shared-secret-for-this-pool"))
	s := ShortHash(h)
	require.Len(t, s, 8)
	require.Regexp(t, `^[0-9a-f]{8}$`, s)
	require.Equal(t, s, ShortHash(h), "stable for the same key")

	var fixed [32]byte
	copy(fixed[:], []byte{0xde, 0xad, 0xbe, 0xef, 0x01, 0x02})
	require.Equal(t, "deadbeef", ShortHash(fixed))
	require.NotEqual(t, s, ShortHash(sha256.Sum256([]byte("other"))))
}
