package e2b_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// routesOf counts the control-plane create and connect requests by the
// generation of their route.
func routesOf(srv *e2btest.Server) (v2Create, v1Create, v2Connect, v1Connect int) {
	for _, r := range srv.Requests() {
		if r.Plane != e2btest.API || r.Method != "POST" {
			continue
		}
		switch {
		case r.Path == "/v2/sandboxes":
			v2Create++
		case r.Path == "/sandboxes":
			v1Create++
		case strings.HasPrefix(r.Path, "/v2/sandboxes/") && strings.HasSuffix(r.Path, "/connect"):
			v2Connect++
		case strings.HasPrefix(r.Path, "/sandboxes/") && strings.HasSuffix(r.Path, "/connect"):
			v1Connect++
		}
	}
	return
}

// On the current service the provider creates and connects with the v2
// routes only, and its sandboxes are secure: envd takes their commands
// with the token create gave (the fake refuses a call without it).
func TestSpeaksV2(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("gen-v2")
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Resume(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"v2"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "v2\n" {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	v2c, v1c, v2n, v1n := routesOf(e.srv)
	if v2c != 1 || v1c != 0 || v2n < 1 || v1n != 0 {
		t.Fatalf("creates v2 %d v1 %d, connects v2 %d v1 %d: want only v2 routes", v2c, v1c, v2n, v1n)
	}
}

// A service without the v2 routes answers them 404 (or 405): the provider
// falls back to the v1 routes once, at its first create, and from then on
// sends only v1 (it does not probe again per call).
func TestFallsBackToV1Once(t *testing.T) {
	for _, status := range []int{404, 405} {
		t.Run(http404or405(status), func(t *testing.T) {
			e := newEnv(t, e2btest.Options{Generation: e2btest.V1}, nil)
			if status == 405 {
				e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Method: "POST", Path: "/v2/sandboxes", Status: 405,
					Body: `{"code":405,"message":"Method Not Allowed"}`, Times: -1})
			}
			a := e.create("gen-v1-a")
			b := e.create("gen-v1-b")
			for _, h := range []*sandbox.Handle{a, b} {
				if err := e.p.Suspend(ctx(t), h); err != nil {
					t.Fatal(err)
				}
				res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"v1"}}, sandbox.ExecOptions{})
				if err != nil || string(res.Output) != "v1\n" {
					t.Fatalf("Exec after a resume = %+v, %v", res, err)
				}
			}
			v2c, v1c, v2n, v1n := routesOf(e.srv)
			if v2c != 1 || v1c != 2 || v2n != 0 || v1n < 2 {
				t.Fatalf("creates v2 %d v1 %d, connects v2 %d v1 %d: want one v2 probe, then v1 only", v2c, v1c, v2n, v1n)
			}
		})
	}
}

func http404or405(s int) string {
	if s == 404 {
		return "404"
	}
	return "405"
}

// Until a create or connect has succeeded nothing is decided: an unknown
// template (404 on either route) is Invalid{template} and the next create
// probes v2 again, which the current service then answers.
func TestUnknownTemplateDecidesNothing(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, func(c *e2b.Config) { c.Template = "nope" })
	_, err := e.p.Create(ctx(t), "gen-bad", sandbox.CreateOptions{})
	var inv *sandbox.InvalidError
	if !errors.As(err, &inv) || inv.Reason != "template" {
		t.Fatalf("Create with an unknown template = %v, want Invalid{template}", err)
	}
	v2c, v1c, _, _ := routesOf(e.srv)
	if v2c != 1 || v1c != 1 {
		t.Fatalf("creates v2 %d v1 %d, want the v2 404 tried on v1 once", v2c, v1c)
	}
}

// A secure sandbox's token never reaches Info.Raw (GET /sandboxes/{id}
// carries it), and a provider that did not create the sandbox reads it
// from the sandbox's record to reach envd.
func TestTokenKeptSecret(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("gen-secret")
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	info, err := e.p.Get(ctx(t), h)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(info.Raw, &raw); err != nil || raw["sandboxID"] == nil {
		t.Fatalf("Info.Raw = %s, %v", info.Raw, err)
	}
	if _, ok := raw["envdAccessToken"]; ok || strings.Contains(string(info.Raw), "AccessToken") {
		t.Fatalf("Info.Raw carries the sandbox's access token: %s", info.Raw)
	}
	// Another provider (another process: a later CLI run), with no handle state.
	other, err := e2b.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fresh := &sandbox.Handle{Provider: e2b.Name, Name: "gen-secret"}
	res, err := other.Exec(ctx(t), fresh, sandbox.Cmd{Name: "echo", Args: []string{"ok"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "ok\n" {
		t.Fatalf("Exec from another provider = %+v, %v", res, err)
	}
}
