package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
)

// Issue 24 item 8: while a listener is attached, the daemon keeps at most
// the journal bound of a session's output in memory, and a listener that
// attaches after the journal was trimmed still gets every byte from byte
// zero, exactly once, in order (the provider replays it), while the
// listeners already attached miss nothing.
func TestTrimmedJournalBoundedAndExact(t *testing.T) {
	const bound = 64
	defer runner.SetMaxJournal(bound)()
	rp := newRawPlatform(t)
	d := newDaemon(t, rp.ts.URL, newFake(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	c := rp.accept(t)

	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["out:r","stay"],"stdin":true}`)
	r := c.reply(2)
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(r.Result, &res)
	sid := res.SessionID
	const n = 300
	attaches := map[int]int64{n / 3: 3, n / 2: 5, 2 * n / 3: 6}
	for i := 0; i < n; i++ {
		c.send(`{"id":%d,"op":"stdin","name":"sb","session_id":%q,"data":%q}`, 100+i, sid, wire.EncodeData([]byte(fmt.Sprintf("%d,", i))))
		if id, ok := attaches[i]; ok {
			c.send(`{"id":%d,"op":"attach","name":"sb","session_id":%q}`, id, sid)
		}
	}
	c.send(`{"id":4,"op":"stdin_close","name":"sb","session_id":%q}`, sid)

	views := map[int64]*strings.Builder{2: {}, 3: {}, 5: {}, 6: {}}
	attached := map[int64]bool{2: true}
	ended := map[int64]bool{}
	for len(ended) < len(views) {
		f := c.next()
		if f.ID != nil {
			if v := views[*f.ID]; v != nil && *f.ID != 2 {
				if f.Error != "" {
					t.Fatalf("attach %d: %+v", *f.ID, f)
				}
				attached[*f.ID] = true
			}
			continue
		}
		if f.ReplayFor != 0 {
			v := views[f.ReplayFor]
			if v == nil {
				t.Fatalf("replay for unknown request: %+v", f)
			}
			if ended[f.ReplayFor] {
				t.Fatalf("request %d got a frame after its end: %+v", f.ReplayFor, f)
			}
			v.Write(f.Data)
			if f.Stream == "exit" {
				ended[f.ReplayFor] = true
			}
			continue
		}
		for id := range attached {
			if ended[id] {
				continue
			}
			views[id].Write(f.Data)
			if f.Stream == "exit" {
				ended[id] = true
			}
		}
	}
	var want strings.Builder
	want.WriteString("r")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&want, "echo:%d,", i)
	}
	for id, v := range views {
		if v.String() != want.String() {
			t.Errorf("listener %d: %d bytes, want %d\n got %q", id, v.Len(), want.Len(), v.String())
		}
	}
	held, trimmed := d.JournalBytes("sb")
	if !trimmed || held > bound {
		t.Fatalf("daemon holds %d bytes of journal (trimmed %v), want ≤ %d and trimmed", held, trimmed, bound)
	}
}
