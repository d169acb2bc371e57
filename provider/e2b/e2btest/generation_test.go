package e2btest_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/provider/e2b/e2btest"
)

type wire struct {
	t   *testing.T
	srv *e2btest.Server
	c   *http.Client
}

func newWire(t *testing.T, o e2btest.Options) *wire {
	srv := e2btest.NewServer(o)
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(func() { c.CloseIdleConnections(); srv.Close() })
	return &wire{t: t, srv: srv, c: c}
}

// api sends a control-plane request and returns its status and JSON body.
func (w *wire) api(method, path, body string) (int, map[string]any) {
	w.t.Helper()
	req, _ := http.NewRequest(method, w.srv.APIURL()+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", w.srv.APIKey())
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.c.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// envd sends a unary envd call for sandbox id with the given access token
// ("" for none) and returns its status.
func (w *wire) envd(id, token, path, body string) int {
	w.t.Helper()
	req, _ := http.NewRequest("POST", w.srv.SandboxURL()+path, strings.NewReader(body))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := w.c.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// The v1 generation has no v2 create or connect; its create defaults to
// 15 s, is not secure unless asked, and its connect requires a timeout.
func TestGenerationV1(t *testing.T) {
	w := newWire(t, e2btest.Options{Generation: e2btest.V1})
	if st, _ := w.api("POST", "/v2/sandboxes", `{"templateID":"base"}`); st != 404 {
		t.Fatalf("v1: POST /v2/sandboxes = %d, want 404", st)
	}
	st, sb := w.api("POST", "/sandboxes", `{"templateID":"base"}`)
	id, _ := sb["sandboxID"].(string)
	if st != 201 || id == "" || sb["envdAccessToken"] != nil {
		t.Fatalf("v1 create = %d %v, want 201 without a token", st, sb)
	}
	if s, _ := w.srv.Lookup(id); time.Until(s.EndAt) > 16*time.Second {
		t.Errorf("v1 create's default TTL ends in %v, want 15 s", time.Until(s.EndAt))
	}
	if st, _ := w.api("POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":60}`); st != 404 {
		t.Fatalf("v1: POST /v2/sandboxes/{id}/connect = %d, want 404", st)
	}
	if st, _ := w.api("POST", "/sandboxes/"+id+"/connect", `{}`); st != 400 {
		t.Fatalf("v1 connect without timeout = %d, want 400", st)
	}
	if st, _ := w.api("POST", "/sandboxes/"+id+"/connect", `{"timeout":60}`); st != 200 {
		t.Fatalf("v1 connect = %d, want 200", st)
	}
	if st := w.envd(id, "", "/process.Process/List", `{}`); st != 200 {
		t.Fatalf("envd of a sandbox that is not secure, without a token = %d, want 200", st)
	}
	st, sb = w.api("POST", "/sandboxes", `{"templateID":"base","secure":true}`)
	if st != 201 || sb["envdAccessToken"] == nil {
		t.Fatalf("v1 secure create = %d %v, want a token", st, sb)
	}
}

// The v2 generation's sandboxes are secure: envd refuses every call but
// /health without the sandbox's own token (another sandbox's token too),
// and connect needs no body.
func TestGenerationV2Secure(t *testing.T) {
	w := newWire(t, e2btest.Options{})
	_, a := w.api("POST", "/v2/sandboxes", `{"templateID":"base"}`)
	_, b := w.api("POST", "/v2/sandboxes", `{"templateID":"base"}`)
	id, _ := a["sandboxID"].(string)
	token, _ := a["envdAccessToken"].(string)
	other, _ := b["envdAccessToken"].(string)
	if id == "" || token == "" || other == "" {
		t.Fatalf("v2 creates = %v, %v, want ids and tokens", a, b)
	}
	if s, _ := w.srv.Lookup(id); time.Until(s.EndAt) < 290*time.Second {
		t.Errorf("v2 create's default TTL ends in %v, want 300 s", time.Until(s.EndAt))
	}
	for _, path := range []string{"/process.Process/List", "/filesystem.Filesystem/Stat", "/files?path=x"} {
		for _, tok := range []string{"", other, token + "x"} {
			if st := w.envd(id, tok, path, `{"path":"/home/user"}`); st != 401 {
				t.Errorf("%s with token %q = %d, want 401", path, tok, st)
			}
		}
	}
	if st := w.envd(id, token, "/process.Process/List", `{}`); st != 200 {
		t.Fatalf("List with the token = %d", st)
	}
	req, _ := http.NewRequest("GET", w.srv.SandboxURL()+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	if resp, err := w.c.Do(req); err != nil || resp.StatusCode != 204 {
		t.Fatalf("/health without a token = %v %v, want 204", resp, err)
	} else {
		resp.Body.Close()
	}
	// A refused Start ran nothing.
	body, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "sh", "args": []string{"-c", "touch ran"}}})
	env := append([]byte{0, 0, 0, 0, 0}, body...)
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	req, _ = http.NewRequest("POST", w.srv.SandboxURL()+"/process.Process/Start", bytes.NewReader(env))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := w.c.Do(req)
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("Start without a token = %v %v, want 401", resp, err)
	}
	resp.Body.Close()
	if s, _ := w.srv.Lookup(id); s.Processes != 0 {
		t.Fatalf("a refused Start left %d processes", s.Processes)
	}
	if st, m := w.api("POST", "/v2/sandboxes/"+id+"/connect", ``); st != 200 || m["envdAccessToken"] != token {
		t.Fatalf("v2 connect without a body = %d %v, want 200 and the token", st, m)
	}
	if st, m := w.api("GET", "/sandboxes/"+id, ``); st != 200 || m["envdAccessToken"] != token {
		t.Fatalf("GET /sandboxes/{id} = %d %v, want the token", st, m)
	}
}

// The current SDK cannot create on a service of the v1 generation: its
// create is POST /v2/sandboxes, which such a service answers 404. (This is
// why the Go adapter falls back and the SDK cannot.)
func TestSDKOnV1(t *testing.T) {
	sdk := nodesdk.Setup(t, SDKPackage)
	srv := e2btest.NewServer(e2btest.Options{Generation: e2btest.V1})
	defer srv.Close()
	res := sdk.Run(t, "sdk/e2b.mjs", nodesdk.Options{
		Env:     map[string]string{"E2B_API_URL": srv.APIURL(), "E2B_SANDBOX_URL": srv.SandboxURL(), "E2B_API_KEY": srv.APIKey()},
		Timeout: time.Minute,
	})
	c := res.Call(t, "create")
	if c.OK || c.Error.Name != "SandboxError" || !strings.HasPrefix(c.Error.Message, "404") {
		t.Fatalf("create on v1 = ok %v %s, want SandboxError 404", c.OK, c.Err())
	}
	if res.Done || len(srv.Sandboxes()) != 0 {
		t.Fatalf("the script went on (done %v) or made sandboxes (%d)", res.Done, len(srv.Sandboxes()))
	}
}
