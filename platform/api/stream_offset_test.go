package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// streamAll opens a stream with start and reads it to its end: the
// started message, the output (stdout and stderr together, each tagged
// byte kept as it came) and the terminal message.
func streamAll(t *testing.T, pl *apitest.Platform, key, name string, start api.StreamStart) (api.StreamMsg, string, api.StreamMsg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/"+name+"/stream",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	b, _ := json.Marshal(start)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	var started api.StreamMsg
	var out strings.Builder
	for first := true; ; first = false {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("stream %+v: %v after %q", start, err, out.String())
		}
		if typ == websocket.MessageBinary {
			if len(b) > 0 {
				out.Write(b[1:])
			}
			continue
		}
		var m api.StreamMsg
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if first {
			started = m
			if m.Type != api.MsgStarted {
				return started, out.String(), m
			}
			continue
		}
		if m.Type == api.MsgExit || m.Type == api.MsgError {
			return started, out.String(), m
		}
	}
}

// TestAttachFromOffset: an attach with an offset gets the session's
// output past that many bytes (stdout and stderr together, in the
// journal's order), at every offset from 0 to past the end, each byte
// once, and started says the offset it skipped; a negative offset, and
// an offset on a spawn, are invalid{json} naming offset. Fails on the old
// code: the offset was not read, every attach replayed from byte zero.
func TestAttachFromOffset(t *testing.T) {
	fp := fake.New()
	t.Cleanup(func() { _ = fp.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": fp},
		Env: map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"}})
	alice := pl.Account(t, "alice")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "off"}`)); a.status != 201 {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	started, all, end := streamAll(t, pl, alice, "off", api.StreamStart{Op: "spawn", Cmd: "emit", Detachable: true,
		Args: []string{"out:abc", "err:DEFG", "out:h", "sleep:10ms", "out:ijklmn", "exit:4"}})
	if end.Type != api.MsgExit || *end.Code != 4 || all != "abcDEFGhijklmn" {
		t.Fatalf("spawn: %q, %+v", all, end)
	}
	sid := started.SessionID
	for off := 0; off <= len(all)+3; off++ {
		st, got, end := streamAll(t, pl, alice, "off", api.StreamStart{Op: "attach", SessionID: sid, Offset: int64(off)})
		want := ""
		if off < len(all) {
			want = all[off:]
		}
		if st.Type != api.MsgStarted || st.Offset != int64(off) || got != want || end.Type != api.MsgExit || *end.Code != 4 {
			t.Errorf("attach at %d: started %+v, output %q (want %q), end %+v", off, st, got, want, end)
		}
	}
	for _, bad := range []api.StreamStart{
		{Op: "attach", SessionID: sid, Offset: -1},
		{Op: "spawn", Cmd: "emit", Args: []string{"out:x"}, Offset: 3},
	} {
		st, _, _ := streamAll(t, pl, alice, "off", bad)
		if st.Type != api.MsgError || st.Error == nil || st.Error.Kind != "invalid" || st.Error.Field != "offset" {
			t.Errorf("%+v: %+v %+v, want invalid, field offset", bad, st, st.Error)
		}
	}
}
