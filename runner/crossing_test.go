package runner_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// noIDs is the fake whose Spawn gives no session id, so the daemon makes
// ids up (s-<unix>-<seq>).
type noIDs struct{ *fake.Provider }

func (p noIDs) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.SpawnOptions) (*sandbox.Command, error) {
	cmd, err := p.Provider.Spawn(ctx, h, c, o)
	if cmd != nil {
		cmd.SessionID = ""
	}
	return cmd, err
}

// dashIDs is the fake whose session ids look like the daemon's made-up
// ones.
type dashIDs struct{ *fake.Provider }

func (p dashIDs) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.SpawnOptions) (*sandbox.Command, error) {
	cmd, err := p.Provider.Spawn(ctx, h, c, o)
	if cmd != nil {
		cmd.SessionID = "s-9-" + strings.TrimPrefix(cmd.SessionID, "fake-sess-")
	}
	return cmd, err
}

func (p dashIDs) Attach(ctx context.Context, h *sandbox.Handle, id string, o sandbox.AttachOptions) (*sandbox.Command, error) {
	cmd, err := p.Provider.Attach(ctx, h, "fake-sess-"+strings.TrimPrefix(id, "s-9-"), o)
	if cmd != nil {
		cmd.SessionID = id
	}
	return cmd, err
}

func sessionOf(t *testing.T, f frame) string {
	t.Helper()
	var r struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(f.Result, &r)
	if r.SessionID == "" {
		t.Fatalf("no session id: %+v", f)
	}
	return r.SessionID
}

// TestNoRequestCrossesSandboxes: whatever id a request gives (one the
// daemon made up, a provider's that looks like one, another sandbox's
// tagged one) and whether it names a sandbox or none, stdin, attach and
// detach reach only the sessions of the sandbox the request names (a
// review found each of these crossing).
func TestNoRequestCrossesSandboxes(t *testing.T) {
	for _, c := range []struct {
		name string
		p    func(*testing.T) sandbox.Provider
	}{
		{"made-up ids", func(t *testing.T) sandbox.Provider { return noIDs{newFake(t)} }},
		{"provider ids like made-up ones", func(t *testing.T) sandbox.Provider { return dashIDs{newFake(t)} }},
		{"provider ids", func(t *testing.T) sandbox.Provider { return newFake(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, pc, _ := serveRaw(t, c.p(t))
			pc.call(1, `{"id":1,"op":"create","name":"a"}`)
			pc.call(2, `{"id":2,"op":"create","name":"b"}`)
			pc.send(`{"id":3,"op":"spawn","name":"a","cmd":"emit","args":["out:secret-of-a","stay"],"stdin":true}`)
			sid := sessionOf(t, pc.reply(3))
			if f := pc.next(); string(f.Data) != "secret-of-a" {
				t.Fatalf("%+v", f)
			}
			bare, _, _ := strings.Cut(sid, "--")
			for i, id := range []string{sid, bare} {
				for j, req := range []string{
					`{"id":%d,"op":"stdin","name":"b","session_id":%q,"data":"aW5qZWN0ZWQ="}`,
					`{"id":%d,"op":"stdin","session_id":%q,"data":"aW5qZWN0ZWQ="}`,
					`{"id":%d,"op":"attach","name":"b","session_id":%q}`,
					`{"id":%d,"op":"attach","session_id":%q}`,
				} {
					rid := int64(10 + 10*i + j)
					if f := pc.call(rid, req, rid, id); f.OK || f.Error != "not_found" {
						t.Errorf("%s with id %q: %+v, want not_found", strings.Split(req, `"op":`)[1][:12], id, f)
					}
				}
			}
			// A detach naming b leaves a's session attached: a's own stdin
			// still comes back live.
			pc.call(40, `{"id":40,"op":"detach","name":"b","session_id":%q}`, sid)
			// The echo of a's own stdin may come before or after the
			// stdin's reply: read both.
			pc.send(`{"id":41,"op":"stdin","name":"a","session_id":%q,"data":"eA=="}`, sid)
			var echo string
			for replied := false; !replied || echo == ""; {
				f := pc.next() // fails the test after 10 s without a frame
				switch {
				case f.ID != nil && *f.ID == 41:
					replied = true
				case f.Stream == "stdout":
					echo = string(f.Data)
				}
			}
			if echo != "echo:x" {
				t.Fatalf("a's live output after b's detach: %q", echo)
			}
		})
	}
}
