package wire

import (
	"encoding/json"
	"testing"
)

// FuzzDecode checks that Decode never panics, that its JSON verdict agrees
// with encoding/json's, and that a decoded stream frame re-encodes to a frame
// that decodes to the same thing.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"ok":true,"result":{"session_id":"s-1"}}`,
		`{"id":2,"ok":false,"error":"not_found","detail":""}`,
		`{"stream":"stdout","session_id":"s-1","data":"aGkK","replay_for":1}`,
		`{"stream":"exit","session_id":"s-1","code":0}`,
		`{"hello":1}`, `[]`, `nope`, `{"id":1e3}`, `{"a":"\u00e9\n"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Decode(b)
		if (err == nil) != json.Valid(b) {
			t.Fatalf("Decode err=%v but json.Valid=%v for %q", err, json.Valid(b), b)
		}
		if err != nil {
			return
		}
		switch fr.Kind {
		case KindReply:
			if fr.Reply == nil {
				t.Fatal("reply without Reply")
			}
			_ = fr.Reply.Err()
		case KindStream:
			s := fr.Stream
			if s.Malformed {
				return
			}
			again, err := Decode(AppendStream(nil, s))
			if err != nil || again.Kind != KindStream {
				t.Fatalf("re-encode of %+v: %v", s, err)
			}
			a := again.Stream
			if a.Kind != s.Kind || a.SessionID != s.SessionID || a.ReplayFor != s.ReplayFor ||
				string(a.Data) != string(s.Data) && (s.Kind == StreamStdout || s.Kind == StreamStderr) {
				t.Fatalf("round trip: %+v → %+v", s, a)
			}
		}
	})
}
