package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// noURL is provider/fake without public_url.
type noURL struct{ *fake.Provider }

func (p noURL) Capabilities() sandbox.Capabilities {
	return p.Provider.Capabilities().Without(sandbox.CapPublicURL)
}

// TestURLsAreRealOrAbsent: where the provider advertises public_url the
// record keeps the URL, the API returns it as url, and every command gets
// SANDBOX_URL (exec and spawn); elsewhere there is no url, GET .../url is
// unsupported (501) and no command gets SANDBOX_URL.
func TestURLsAreRealOrAbsent(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    sandbox.Provider
		has  bool
	}{{"public_url", fake.New(), true}, {"none", noURL{fake.New()}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				if c, ok := tc.p.(interface{ Close() error }); ok {
					_ = c.Close()
				}
			})
			pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": tc.p}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
			key := pl.Account(t, "alice")
			a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "web"}`))
			var v api.Sandbox
			if a.status != 201 || json.Unmarshal(a.body, &v) != nil {
				t.Fatalf("create = %d %s", a.status, a.body)
			}
			if tc.has != (v.URL != "") || (tc.has && !strings.HasPrefix(v.URL, "https://")) {
				t.Fatalf("url = %q (provider advertises public_url: %v)", v.URL, tc.has)
			}
			if tc.has != strings.Contains(string(a.body), `"url"`) {
				t.Fatalf("the answer's url field: %s", a.body)
			}
			u := call(t, "GET", pl.URL+"/v1/sandboxes/web/url", key, nil)
			if tc.has && (u.status != 200 || !strings.Contains(string(u.body), v.URL)) || !tc.has && (u.status != 501 || u.err.Kind != "not_supported") {
				t.Fatalf("GET url = %d %s", u.status, u.body)
			}
			e := call(t, "POST", pl.URL+"/v1/sandboxes/web/exec", key, strings.NewReader(`{"cmd": "emit", "args": ["env:SANDBOX_URL"]}`))
			var res api.ExecResult
			if e.status != 200 || json.Unmarshal(e.body, &res) != nil || string(res.Output) != v.URL {
				t.Fatalf("SANDBOX_URL in exec = %d %s, want %q", e.status, e.body, v.URL)
			}
			c := newPlatformClient(t, pl, key)
			cmd, err := c.Spawn(t.Context(), sandbox.BuildHandle("platform", "web"), sandbox.Cmd{Name: "emit", Args: []string{"env:SANDBOX_URL", "exit:0"}}, sandbox.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			for ev := range cmd.Events() {
				out.Write(ev.Data)
			}
			if out.String() != v.URL {
				t.Fatalf("SANDBOX_URL in spawn = %q, want %q", out.String(), v.URL)
			}
		})
	}
}
