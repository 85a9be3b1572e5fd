package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"github.com/warren-tunnel/warren/group"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func allMessages() []Message {
	return []Message{
		&Hello{Version: Version, Token: "tok", Client: "warren/test"},
		&Hello{Version: Version, Token: "tok", Features: []string{FeatureStreamReset, "a-later-one"}},
		&Welcome{Version: Version, SessionID: "s1", RegionID: "eu"},
		&Error{Code: CodeUnauthorized, Message: "invalid auth token"},
		&Register{Req: 7, Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: hash,
			Health: &HealthInfo{Kind: "tcp", IntervalMS: 10000, TimeoutMS: 3000, MaxFailed: 3, AlertWebhook: "https://hooks.example/x"}},
		&Register{Req: 8, Proto: group.ProtoTCP, Label: "db"},
		&Register{Req: 9, Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: hash, Name: "web", Host: "host-a.example"},
		&Registered{Req: 7, TunnelID: "t1", URL: "http://pool.example.com", Group: "web"},
		&Registered{Req: 8, TunnelID: "t2", URL: "tcp://example.com:20000", Port: 20000},
		&Rejected{Req: 7, Code: CodeKeyMismatch, Message: "group key does not match"},
		&Health{TunnelID: "t1", Healthy: false, Reason: "3 consecutive probe failures"},
		&Drain{TunnelID: "t1"},
		&Deregister{TunnelID: "t1"},
		&Deregistered{TunnelID: "t1", Reason: "drained"},
		&Reset{Streams: []uint32{2, 4, 1 << 31}},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	for _, m := range allMessages() {
		require.NoError(t, WriteFrame(&buf, m))
	}
	for _, want := range allMessages() {
		got, err := ReadFrame(&buf)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := ReadFrame(&buf)
	require.ErrorIs(t, err, io.EOF, "clean end between frames is io.EOF")
}

func frame(t Type, payload string) []byte {
	b := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func TestReadFrameRejectsBadInput(t *testing.T) {
	oversized := []byte{byte(TypeHello), 0xff, 0xff, 0xff, 0xff}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"oversized announces 4 GiB", oversized, ErrFrameTooLarge},
		{"just over the limit", frame(TypeHello, strings.Repeat(" ", MaxFrameSize+1))[:headerSize], ErrFrameTooLarge},
		{"unknown type", frame(Type(99), "{}"), ErrUnknownFrame},
		{"zero type", frame(Type(0), "{}"), ErrUnknownFrame},
		{"not json", frame(TypeHello, "{nope"), ErrMalformed},
		{"wrong json type", frame(TypeHello, `{"version":"one"}`), ErrMalformed},
		{"truncated payload", frame(TypeHello, `{"version":1}`)[:9], io.ErrUnexpectedEOF},
		{"truncated header", []byte{byte(TypeHello), 0, 0}, io.ErrUnexpectedEOF},
		{"bad proto", frame(TypeRegister, `{"proto":"udp","label":"x"}`), ErrMalformed},
		{"group without key", frame(TypeRegister, `{"proto":"tcp","label":"x","group":"g"}`), ErrMalformed},
		{"key hash not hex", frame(TypeRegister, `{"proto":"tcp","label":"x","group":"g","key_hash":"zz"}`), ErrMalformed},
		{"label too long", frame(TypeRegister, `{"proto":"http","label":"`+strings.Repeat("a", MaxLabelLen+1)+`"}`), ErrMalformed},
		{"health for no tunnel", frame(TypeHealth, `{"healthy":true}`), ErrMalformed},
		{"negative interval", frame(TypeRegister, `{"proto":"tcp","label":"x","health":{"kind":"tcp","interval_ms":-1}}`), ErrMalformed},
		{"reset of nothing", frame(TypeReset, `{"streams":[]}`), ErrMalformed},
		{"reset of too many", frame(TypeReset, `{"streams":[`+strings.Repeat("2,", MaxResetStreams)+`2]}`), ErrMalformed},
		{"reset of a negative id", frame(TypeReset, `{"streams":[-2]}`), ErrMalformed},
		{"too many features", frame(TypeHello, `{"version":1,"features":[`+strings.Repeat(`"x",`, MaxFeatures)+`"x"]}`), ErrMalformed},
		{"feature too long", frame(TypeHello, `{"version":1,"features":["`+strings.Repeat("a", MaxLabelLen+1)+`"]}`), ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.in))
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestWriteFrameRefusesInvalid(t *testing.T) {
	var buf bytes.Buffer
	err := WriteFrame(&buf, &Health{})
	require.ErrorIs(t, err, ErrMalformed)
	require.Zero(t, buf.Len(), "nothing is written for an invalid message")
	err = WriteFrame(&buf, &Rejected{Message: strings.Repeat("x", MaxErrorMessage+1)})
	require.ErrorIs(t, err, ErrMalformed)
}

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, e := range []Envelope{
		{TunnelID: "t1", RemoteAddr: "203.0.113.9:51234", Proto: group.ProtoHTTP},
		{TunnelID: strings.Repeat("i", MaxTunnelIDLen), RemoteAddr: "[2001:db8::1]:443", Proto: group.ProtoHTTPS},
		{TunnelID: "t", Proto: group.ProtoTCP},
	} {
		b, err := AppendEnvelope(nil, e)
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), MaxEnvelopeSize)
		r := bytes.NewReader(append(b, "payload"...))
		got, err := ReadEnvelope(r)
		require.NoError(t, err)
		require.Equal(t, e, got)
		rest, _ := io.ReadAll(r)
		require.Equal(t, "payload", string(rest), "the envelope reader consumes exactly the envelope")
	}
}

func TestEnvelopeLongRemoteAddrIsTruncated(t *testing.T) {
	b, err := AppendEnvelope(nil, Envelope{TunnelID: "t", Proto: group.ProtoTCP, RemoteAddr: strings.Repeat("a", 400)})
	require.NoError(t, err)
	got, err := ReadEnvelope(bytes.NewReader(b))
	require.NoError(t, err)
	require.Len(t, got.RemoteAddr, MaxRemoteAddr)
}

func TestEnvelopeRejectsBadInput(t *testing.T) {
	_, err := AppendEnvelope(nil, Envelope{TunnelID: "", Proto: group.ProtoTCP})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = AppendEnvelope(nil, Envelope{TunnelID: "t", Proto: "udp"})
	require.ErrorIs(t, err, ErrMalformed)

	cases := map[string]struct {
		in   []byte
		want error
	}{
		"empty":           {nil, io.EOF},
		"bad version":     {[]byte{9, 1, 1, 'a', 0}, ErrMalformed},
		"bad proto":       {[]byte{1, 9, 1, 'a', 0}, ErrMalformed},
		"zero id":         {[]byte{1, 1, 0, 0}, ErrMalformed},
		"id too long":     {[]byte{1, 1, MaxTunnelIDLen + 1}, ErrMalformed},
		"truncated id":    {[]byte{1, 1, 5, 'a'}, io.ErrUnexpectedEOF},
		"truncated addr":  {[]byte{1, 1, 1, 'a', 9, '1'}, io.ErrUnexpectedEOF},
		"missing addrlen": {[]byte{1, 1, 1, 'a'}, io.ErrUnexpectedEOF},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ReadEnvelope(bytes.NewReader(tc.in))
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func BenchmarkEnvelopeEncode(b *testing.B) {
	e := Envelope{TunnelID: "3f9c2a71d0b84e55", RemoteAddr: "203.0.113.9:51234", Proto: group.ProtoHTTP}
	buf := make([]byte, 0, MaxEnvelopeSize)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendEnvelope(buf[:0], e)
	}
}

func BenchmarkEnvelopeDecode(b *testing.B) {
	enc, _ := AppendEnvelope(nil, Envelope{TunnelID: "3f9c2a71d0b84e55", RemoteAddr: "203.0.113.9:51234", Proto: group.ProtoHTTP})
	r := bytes.NewReader(enc)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(enc)
		if _, err := ReadEnvelope(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFrameRoundTrip(b *testing.B) {
	m := &Health{TunnelID: "3f9c2a71d0b84e55", Healthy: true, Reason: "probe succeeded"}
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := WriteFrame(&buf, m); err != nil {
			b.Fatal(err)
		}
		if _, err := ReadFrame(&buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestUnreadNotice: a notice is recognised only for its own stream under its own session's
// key; anything else, such as a backend's bytes that begin the same way, is not a notice.
func TestUnreadNotice(t *testing.T) {
	key, other := NoticeKey("token-a"), NoticeKey("token-b")
	n := AppendUnreadNotice(nil, &key, 7)
	require.Len(t, n, UnreadNoticeLen)
	require.True(t, MaybeUnreadNotice(n))
	require.True(t, IsUnreadNotice(n, &key, 7))
	require.False(t, IsUnreadNotice(n, &key, 9), "another stream's notice")
	require.False(t, IsUnreadNotice(n, &other, 7), "another session's notice")
	for i := range n {
		bad := append([]byte(nil), n...)
		bad[i] ^= 0x40
		require.False(t, IsUnreadNotice(bad, &key, 7), "byte %d altered", i)
	}
	require.False(t, IsUnreadNotice(n[:UnreadNoticeLen-1], &key, 7), "short")
	require.False(t, IsUnreadNotice([]byte{0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0}, &key, 7), "a backend's guess")
	require.False(t, MaybeUnreadNotice([]byte("HTTP/1.1 200 OK\r\n")), "a response head")
}

// A Register without name and host (an older connector's) is valid and decodes with both
// empty; one with them carries them. An older edge's decoder ignores fields it does not
// know, so either side may be older than the other.
func TestRegisterNameAndHostAreOptional(t *testing.T) {
	m, err := ReadFrame(bytes.NewReader(frame(TypeRegister, `{"req":1,"proto":"http","label":"pool"}`)))
	require.NoError(t, err)
	require.Equal(t, &Register{Req: 1, Proto: group.ProtoHTTP, Label: "pool"}, m)

	m, err = ReadFrame(bytes.NewReader(frame(TypeRegister, `{"req":1,"proto":"http","label":"pool","name":"web","host":"box-1"}`)))
	require.NoError(t, err)
	require.Equal(t, "web", m.(*Register).Name)
	require.Equal(t, "box-1", m.(*Register).Host)

	b, err := AppendFrame(nil, &Register{Req: 1, Proto: group.ProtoHTTP, Label: "pool"})
	require.NoError(t, err)
	require.NotContains(t, string(b), `"name"`, "absent when empty: an old edge sees the frame it knew")
	require.NotContains(t, string(b), `"host"`)

	type oldRegister struct { // the message as an edge built before the fields decodes it
		Req   uint32      `json:"req"`
		Proto group.Proto `json:"proto"`
		Label string      `json:"label"`
	}
	b, err = AppendFrame(nil, &Register{Req: 2, Proto: group.ProtoHTTP, Label: "pool", Name: "web", Host: "box-1"})
	require.NoError(t, err)
	var old oldRegister
	require.NoError(t, json.Unmarshal(b[headerSize:], &old))
	require.Equal(t, oldRegister{Req: 2, Proto: group.ProtoHTTP, Label: "pool"}, old)
}

func TestCleanDisplay(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"web-1", "web-1"},
		{"Host_A.example.com", "Host_A.example.com"},
		{"<script>alert(1)</script>", "_script_alert_1___script_"},
		{`a"b'c&d`, "a_b_c_d"},
		{"billing api", "billing_api"},
		{"line\nbreak\x00", "line_break_"},
		{"héllo", "h_llo"},     // one '_' per character, not per byte
		{"\xff\xfeab", "__ab"}, // invalid UTF-8
		{"a\u202eb", "a_b"},    // a bidi override
		{strings.Repeat("x", 100), strings.Repeat("x", 63)},
		{strings.Repeat("é", 100), strings.Repeat("_", 63)},
	} {
		require.Equal(t, tc.want, CleanDisplay(tc.in, MaxNameLen), "%q", tc.in)
	}
	big := strings.Repeat("<", 10<<20)
	require.Equal(t, strings.Repeat("_", MaxHostLen), CleanDisplay(big, MaxHostLen), "megabytes in, the limit out")
}
