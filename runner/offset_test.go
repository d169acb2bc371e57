package runner_test

import (
	"context"
	"encoding/json"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/runner/wire"
)

// TestAttachAtOffset (issue 31, one path): an attach with an offset
// (wire.CapAttachOffset) gets the session's output from that byte on,
// none of the bytes before it on the socket; one whose offset_crc is not
// the checksum of the bytes before the offset, or whose offset lies past
// the output's end, gets an error frame unavailable/replay_mismatch and
// no output.
func TestAttachAtOffset(t *testing.T) {
	rp := newRawPlatform(t)
	d := newDaemon(t, rp.ts.URL, newFake(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	c := rp.accept(t)

	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["stay"],"stdin":true}`)
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(c.reply(2).Result, &res)
	sid := res.SessionID
	for _, s := range []string{"one,", "two,", "three,"} {
		c.send(`{"id":10,"op":"stdin","name":"sb","session_id":%q,"data":%q}`, sid, wire.EncodeData([]byte(s)))
	}
	c.send(`{"id":11,"op":"stdin_close","name":"sb","session_id":%q}`, sid)
	var whole strings.Builder
	for { // the live view, to the exit
		f := c.next()
		if f.ID != nil || f.ReplayFor != 0 {
			continue
		}
		whole.Write(f.Data)
		if f.Stream == "exit" {
			break
		}
	}
	w := whole.String()
	// (nothing is written before the reply to the spawn: output sent
	// before it would be read and passed over by c.reply)
	if w != "echo:one,echo:two,echo:three," {
		t.Fatalf("output %q", w)
	}
	crc := func(s string) uint32 { return crc32.Checksum([]byte(s), crc32.MakeTable(crc32.Castagnoli)) }
	view := func(id int64) (string, frame) {
		var out strings.Builder
		for {
			f := c.next()
			if f.ID != nil && *f.ID == id && f.Error != "" {
				t.Fatalf("attach %d: %+v", id, f)
			}
			if f.ReplayFor != id {
				continue
			}
			if f.Stream == "exit" || f.Stream == "error" {
				return out.String(), f
			}
			out.Write(f.Data)
		}
	}
	for _, k := range []int{1, 5, len(w) - 1} {
		id := int64(100 + k)
		c.send(`{"id":%d,"op":"attach","name":"sb","session_id":%q,"offset":%d,"offset_crc":%d}`, id, sid, k, crc(w[:k]))
		got, end := view(id)
		if got != w[k:] || end.Stream != "exit" {
			t.Fatalf("attach at %d: %q then %s, want %q then exit", k, got, end.Stream, w[k:])
		}
	}
	for _, tc := range []struct {
		name string
		k    int
		sum  uint32
	}{{"WrongCRC", 5, crc(w[:5]) ^ 1}, {"PastTheEnd", len(w) + 10, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			id := int64(200 + tc.k)
			c.send(`{"id":%d,"op":"attach","name":"sb","session_id":%q,"offset":%d,"offset_crc":%d}`, id, sid, tc.k, tc.sum)
			got, end := view(id)
			if got != "" || end.Stream != "error" || end.Error != wire.CodeUnavailable {
				t.Fatalf("got %q then %+v, want no output and an unavailable error frame", got, end)
			}
		})
	}
}
