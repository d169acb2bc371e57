package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/managoat/managoat/platform/api"
)

// TestPreviewLinkRevoke: each preview link has an id; listed with its
// sandbox's links, revoking it refuses its token and the cookie it was
// exchanged for at once, while another link of the same port goes on
// working; a link of a sandbox made again under the name is gone with
// the old one; another account's sandbox is not found.
func TestPreviewLinkRevoke(t *testing.T) {
	var hits atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "app")
	})
	pl, _, alice, bob := proxied(t, app, nil)
	hc := browser(pl.TS.Listener.Addr().String())
	one := previewLink(t, pl.URL, alice, "web", 8080, 0)
	two := previewLink(t, pl.URL, alice, "web", 8080, 0)
	if one.ID == "" || one.ID == two.ID {
		t.Fatalf("link ids %q %q", one.ID, two.ID)
	}
	cookie := exchange(t, hc, one.URL)
	if resp := get(t, hc, one.Origin+"/", cookie); resp.StatusCode != 200 {
		t.Fatalf("the cookie before the revoke = %d", resp.StatusCode)
	}
	list := func(key string) (int, []api.PreviewLink) {
		t.Helper()
		a := call(t, "GET", pl.URL+"/v1/sandboxes/web/previews", key, nil)
		var l struct {
			Data []api.PreviewLink `json:"data"`
		}
		_ = json.Unmarshal(a.body, &l)
		return a.status, l.Data
	}
	if code, l := list(alice); code != 200 || len(l) != 2 || l[0].ID != one.ID || l[1].ID != two.ID || l[0].Port != 8080 || l[0].Origin != one.Origin || l[0].RevokedAt != nil {
		t.Fatalf("list = %d %+v", code, l)
	}
	if code, l := list(bob); code != 404 || len(l) != 0 {
		t.Fatalf("bob's list of alice's web = %d %+v", code, l)
	}
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/web/previews/"+one.ID, bob, nil); a.status != 404 {
		t.Fatalf("bob revokes alice's link = %d %s", a.status, a.body)
	}
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/web/previews/pl_nope", alice, nil); a.status != 404 {
		t.Fatalf("revoke of no link = %d %s", a.status, a.body)
	}
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/web/previews/"+one.ID, alice, nil); a.status != 204 {
		t.Fatalf("revoke = %d %s", a.status, a.body)
	}
	before := hits.Load()
	if resp := get(t, hc, one.Origin+"/", cookie); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the revoked link's cookie = %d, want 401", resp.StatusCode)
	}
	if resp := get(t, hc, one.URL, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the revoked link = %d, want 401", resp.StatusCode)
	}
	if hits.Load() != before {
		t.Errorf("a revoked link reached the application")
	}
	if code, l := list(alice); code != 200 || len(l) != 2 || l[0].RevokedAt == nil || l[1].RevokedAt != nil {
		t.Fatalf("list after the revoke = %d %+v", code, l)
	}
	// The other link of the port is untouched.
	c2 := exchange(t, hc, two.URL)
	if resp := get(t, hc, two.Origin+"/", c2); resp.StatusCode != 200 {
		t.Errorf("the other link's cookie = %d", resp.StatusCode)
	}
	// Links die with their sandbox.
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/web", alice, nil); a.status/100 != 2 {
		t.Fatalf("delete web = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "web", "publish": [8080]}`)); a.status != 201 {
		t.Fatalf("create web again = %d %s", a.status, a.body)
	}
	if code, l := list(alice); code != 200 || len(l) != 0 {
		t.Errorf("the new web's links = %d %+v, want none", code, l)
	}
	if resp := get(t, hc, two.URL, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a link of the old web = %d, want 401", resp.StatusCode)
	}
}
