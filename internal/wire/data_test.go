package wire

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDataPreambleRoundTrip(t *testing.T) {
	tok, ok := DataTokenOf(NewDataResumeToken("0123456789abcdef0123456789abcdef"))
	require.True(t, ok)
	p := DataPreamble{SessionID: "5f2c9a01d3e4b6a7", Token: tok}
	b, err := AppendDataPreamble(nil, p)
	require.NoError(t, err)
	require.True(t, IsDataPreamble(b[0]))
	require.False(t, IsDataPreamble(0), "yamux's first byte is its version, 0")
	got, err := ReadDataPreamble(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, p, got)
}

func TestDataTokenNeedsTheCapabilityPrefix(t *testing.T) {
	_, ok := DataTokenOf("0123456789abcdef0123456789abcdef")
	require.False(t, ok, "an old edge's resume token: no data connections")
	_, ok = DataTokenOf(DataResumePrefix)
	require.False(t, ok)
	a, ok := DataTokenOf(NewDataResumeToken("a"))
	require.True(t, ok)
	b, _ := DataTokenOf(NewDataResumeToken("b"))
	require.NotEqual(t, a, b, "each session has its own token")
	w := Welcome{Version: Version, SessionID: "s", ResumeToken: NewDataResumeToken("0123456789abcdef0123456789abcdef")}
	require.NoError(t, w.Validate(), "the marked token fits Welcome's limits")
}

func TestDataPreambleRefusals(t *testing.T) {
	good, err := AppendDataPreamble(nil, DataPreamble{SessionID: "s1"})
	require.NoError(t, err)
	_, err = AppendDataPreamble(nil, DataPreamble{})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = AppendDataPreamble(nil, DataPreamble{SessionID: string(make([]byte, MaxTunnelIDLen+1))})
	require.ErrorIs(t, err, ErrMalformed)

	for name, b := range map[string][]byte{
		"yamux":       {0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		"bad magic":   append([]byte{DataMagic, 'X'}, good[2:]...),
		"bad version": append(append([]byte{}, good[:3]...), append([]byte{9}, good[4:]...)...),
		"empty id":    {DataMagic, 'W', 'D', 1, 0},
		"long id":     {DataMagic, 'W', 'D', 1, MaxTunnelIDLen + 1},
	} {
		_, err := ReadDataPreamble(bytes.NewReader(b))
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	for i := range len(good) {
		_, err := ReadDataPreamble(bytes.NewReader(good[:i]))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut after %d bytes", i)
	}
}

// FuzzReadDataPreamble feeds arbitrary bytes to the preamble decoder: it must never panic,
// never read past MaxDataPreambleSize, and any preamble it accepts must re-encode to the
// bytes it read.
func FuzzReadDataPreamble(f *testing.F) {
	good, _ := AppendDataPreamble(nil, DataPreamble{SessionID: "5f2c9a01d3e4b6a7", Token: DataToken{1, 2, 3}})
	f.Add(good)
	f.Add([]byte{DataMagic, 'W', 'D', 1, 64})
	f.Add([]byte{DataMagic, 'W', 'D', 1, 255})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		p, err := ReadDataPreamble(r)
		if read := len(data) - r.Len(); read > MaxDataPreambleSize {
			t.Fatalf("read %d bytes, more than a preamble's %d", read, MaxDataPreambleSize)
		}
		if err != nil {
			return
		}
		enc, err := AppendDataPreamble(nil, p)
		if err != nil {
			t.Fatalf("decoded %#v but cannot re-encode it: %v", p, err)
		}
		if !bytes.Equal(enc, data[:len(enc)]) {
			t.Fatalf("re-encoding differs: %x vs %x", enc, data[:len(enc)])
		}
	})
}
