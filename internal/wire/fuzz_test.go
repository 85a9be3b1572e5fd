package wire

import (
	"bytes"
	"github.com/warren-tunnel/warren/group"
	"testing"
)

// FuzzReadFrame feeds arbitrary bytes to the control-frame decoder: it must never panic, and any
// frame it accepts must survive a re-encode unchanged.
func FuzzReadFrame(f *testing.F) {
	for _, m := range allMessages() {
		b, err := AppendFrame(nil, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{byte(TypeHello), 0xff, 0xff, 0xff, 0xff})
	f.Add(frame(TypeRegister, `{"proto":"http","label":"x","group":"g","key_hash":"00"}`))
	f.Add(frame(TypeHealth, `{"tunnel_id":"t","healthy":"yes"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			m, err := ReadFrame(r)
			if err != nil {
				return
			}
			enc, err := AppendFrame(nil, m)
			if err != nil {
				t.Fatalf("decoded %#v but cannot re-encode it: %v", m, err)
			}
			again, err := ReadFrame(bytes.NewReader(enc))
			if err != nil {
				t.Fatalf("re-encoded frame does not decode: %v", err)
			}
			if again.Type() != m.Type() {
				t.Fatalf("type changed: %s → %s", m.Type(), again.Type())
			}
		}
	})
}

// FuzzReadEnvelope feeds arbitrary bytes to the data-stream envelope decoder.
func FuzzReadEnvelope(f *testing.F) {
	good, _ := AppendEnvelope(nil, Envelope{TunnelID: "t1", RemoteAddr: "127.0.0.1:1", Proto: group.ProtoTCP})
	f.Add(good)
	f.Add([]byte{1, 1, 0})
	f.Add([]byte{1, 3, 64})
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := ReadEnvelope(bytes.NewReader(data))
		if err != nil {
			return
		}
		enc, err := AppendEnvelope(nil, e)
		if err != nil {
			t.Fatalf("decoded %#v but cannot re-encode it: %v", e, err)
		}
		if !bytes.Equal(enc, data[:len(enc)]) {
			t.Fatalf("re-encoding differs: %x vs %x", enc, data[:len(enc)])
		}
	})
}

// FuzzCleanDisplay: whatever a connector sends as its name or host, what the edge keeps is
// at most the limit and only letters, digits, '.', '-' and '_'.
func FuzzCleanDisplay(f *testing.F) {
	f.Add("web-1")
	f.Add("<img src=x onerror=alert(1)>")
	f.Add("h\xffé\u202e")
	f.Fuzz(func(t *testing.T, s string) {
		for _, n := range []int{0, 1, MaxNameLen, MaxHostLen} {
			out := CleanDisplay(s, n)
			if len(out) > n {
				t.Fatalf("CleanDisplay(%q, %d) is %d bytes", s, n, len(out))
			}
			for i := range len(out) {
				c := out[i]
				if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
					t.Fatalf("CleanDisplay(%q, %d) = %q keeps %q", s, n, out, c)
				}
			}
			if CleanDisplay(out, n) != out {
				t.Fatalf("CleanDisplay is not idempotent on %q", out)
			}
		}
	})
}
