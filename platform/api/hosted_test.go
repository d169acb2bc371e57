package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

// TestHostedProviderThroughThePlatform: a hosted provider (Sprites, against
// its fake API) under the platform beside another: a create pinned to it
// lives there, runs there with SANDBOX_URL set to the sprite's own URL, is
// listed with provider "sprites" beside the account's other sandboxes, and
// is destroyed there; its credential is in no answer.
func TestHostedProviderThroughThePlatform(t *testing.T) {
	srv := spritestest.NewServer(spritestest.Options{Token: "spr-secret-token-of-the-platform"})
	t.Cleanup(srv.Close)
	sp, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SPRITES_TOKEN": srv.Token, "SANDBOX_PROVIDER": "fake"},
		Providers: map[string]sandbox.Provider{"sprites": sp, "fake": f}})
	key := pl.Account(t, "alice")
	var bodies []string
	do := func(method, path, body string, want int) []byte {
		t.Helper()
		a := call(t, method, pl.URL+path, key, strings.NewReader(body))
		if a.status != want {
			t.Fatalf("%s %s = %d %s, want %d", method, path, a.status, a.body, want)
		}
		bodies = append(bodies, string(a.body))
		return a.body
	}
	var v api.Sandbox
	if err := json.Unmarshal(do("POST", "/v1/sandboxes", `{"name": "web", "provider": "sprites"}`, 201), &v); err != nil {
		t.Fatal(err)
	}
	if v.Provider != "sprites" || v.URL == "" {
		t.Fatalf("created %+v, want it on sprites with its URL", v)
	}
	do("POST", "/v1/sandboxes", `{"name": "other"}`, 201)
	var res api.ExecResult
	if err := json.Unmarshal(do("POST", "/v1/sandboxes/web/exec", `{"cmd": "sh", "args": ["-c", "echo \"$SANDBOX_URL\""]}`, 200), &res); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Output)); got != v.URL || res.ExitCode != 0 {
		t.Fatalf("exec on the sprite: %q exit %d, want SANDBOX_URL %q", got, res.ExitCode, v.URL)
	}
	var list struct{ Data []api.Sandbox }
	if err := json.Unmarshal(do("GET", "/v1/sandboxes", "", 200), &list); err != nil {
		t.Fatal(err)
	}
	where := map[string]string{}
	for _, s := range list.Data {
		where[s.Name] = s.Provider
	}
	if len(where) != 2 || where["web"] != "sprites" || where["other"] != "fake" {
		t.Fatalf("the list says %v, want web on sprites and other on fake", where)
	}
	names, err := sp.ListAllNames(t.Context())
	if err != nil || len(names) != 1 || !strings.HasPrefix(names[0], api.NamePrefix) {
		t.Fatalf("sprites holds %v (%v), want one platform-made sprite", names, err)
	}
	do("DELETE", "/v1/sandboxes/web", "", 204)
	if names, err := sp.ListAllNames(t.Context()); err != nil || len(names) != 0 {
		t.Fatalf("sprites holds %v (%v) after the destroy", names, err)
	}
	for _, b := range bodies {
		if strings.Contains(b, srv.Token) {
			t.Fatalf("an answer shows the provider's credential: %s", b)
		}
	}
}
