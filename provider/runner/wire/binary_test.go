package wire_test

import (
	"bytes"
	"testing"

	"github.com/managoat/managoat/provider/runner/wire"
)

func TestBinaryStreamRoundTrip(t *testing.T) {
	for _, s := range []wire.Stream{
		{Kind: wire.StreamStdout, SessionID: "s1--0123456789abcdef", Data: []byte("a")},
		{Kind: wire.StreamStderr, SessionID: "é", Data: bytes.Repeat([]byte{0, 255}, wire.MaxChunk/2), ReplayFor: 1<<63 - 1},
	} {
		b, err := wire.AppendBinaryStream(nil, &s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.DecodeBinaryStream(b)
		if err != nil || got.Kind != s.Kind || got.SessionID != s.SessionID || got.ReplayFor != s.ReplayFor || !bytes.Equal(got.Data, s.Data) {
			t.Fatalf("%+v: %+v %v", s, got, err)
		}
	}
	for _, s := range []wire.Stream{
		{Kind: wire.StreamExit, SessionID: "s1"},
		{Kind: wire.StreamStdout, SessionID: "s1"},
		{Kind: wire.StreamStdout, SessionID: string(bytes.Repeat([]byte("x"), 256)), Data: []byte("a")},
		{Kind: wire.StreamStdout, SessionID: "s1", Data: make([]byte, wire.MaxChunk+1)},
	} {
		if _, err := wire.AppendBinaryStream(nil, &s); err != wire.ErrNotBinary {
			t.Errorf("%s %d-byte id, %d bytes: %v, want ErrNotBinary", s.Kind, len(s.SessionID), len(s.Data), err)
		}
	}
}

// FuzzDecodeBinaryStream: whatever a daemon sends, the decoder answers
// an error or a frame that encodes back to the same bytes.
func FuzzDecodeBinaryStream(f *testing.F) {
	b, _ := wire.AppendBinaryStream(nil, &wire.Stream{Kind: wire.StreamStdout, SessionID: "s-1", Data: []byte("hi")})
	f.Add(b)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := wire.DecodeBinaryStream(b)
		if err != nil {
			return
		}
		again, err := wire.AppendBinaryStream(nil, s)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%x decoded to %+v, encodes to %x (%v)", b, s, again, err)
		}
	})
}
