package dashboard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/dashboard"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// TestCSRFAndCookie performs the cross-site attacks on the dashboard and
// sees each refused with nothing made: a sign-in from another origin, a
// create without the CSRF token, with another session's token, from
// another origin, a stream upgrade without the token or from another
// origin; the session cookie is HttpOnly, SameSite=Strict, and the
// API never gets the Cookie header (fails on the old code: no dashboard).
func TestCSRFAndCookie(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	alice, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	d, err := dashboard.New(dashboard.Config{API: pl.API, Store: pl.Store, Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d)
	t.Cleanup(ts.Close)
	do := func(method, path, origin, cookie, csrf, body string, h ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: dashboard.SessionCookie, Value: cookie})
		}
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(h); i += 2 {
			req.Header.Set(h[i], h[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	evil := "http://evil.example"
	if resp, b := do("POST", "/ui/login", evil, "", "", `{"key": "`+alice+`"}`); resp.StatusCode != 403 || !strings.Contains(b, `"csrf"`) || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in from another origin = %d %s", resp.StatusCode, b)
	}
	if resp, _ := do("POST", "/ui/login", ts.URL, "", "", `{"key": "mgk_x_y"}`); resp.StatusCode != 401 {
		t.Errorf("a wrong key = %d", resp.StatusCode)
	}
	resp, b := do("POST", "/ui/login", ts.URL, "", "", `{"key": "`+alice+`"}`)
	var c *http.Cookie
	for _, k := range resp.Cookies() {
		if k.Name == dashboard.SessionCookie {
			c = k
		}
	}
	if resp.StatusCode != 200 || c == nil || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Fatalf("sign-in = %d %s, cookie %+v", resp.StatusCode, b, c)
	}
	tok := b[strings.Index(b, `"csrf":"`)+8:]
	tok = tok[:strings.Index(tok, `"`)]
	_, bb := do("POST", "/ui/login", ts.URL, "", "", `{"key": "`+bob+`"}`)
	bobTok := bb[strings.Index(bb, `"csrf":"`)+8:]
	bobTok = bobTok[:strings.Index(bobTok, `"`)]
	create := `{"name": "x"}`
	for _, a := range []struct{ what, origin, csrf string }{
		{"no token", ts.URL, ""},
		{"bob's token", ts.URL, bobTok},
		{"another origin", evil, tok},
		{"a wrong token", ts.URL, strings.Repeat("0", len(tok))},
	} {
		if resp, b := do("POST", "/ui/v1/sandboxes", a.origin, alice, a.csrf, create); resp.StatusCode != 403 || !strings.Contains(b, `"kind":"denied"`) {
			t.Errorf("a create with %s = %d %s", a.what, resp.StatusCode, b)
		}
	}
	for _, a := range []struct{ what, path, origin string }{
		{"no token", "/ui/v1/sandboxes/x/stream", ts.URL},
		{"another origin", "/ui/v1/sandboxes/x/stream?csrf=" + tok, evil},
	} {
		if resp, _ := do("GET", a.path, a.origin, alice, "", "", "Upgrade", "websocket", "Connection", "Upgrade"); resp.StatusCode != 403 {
			t.Errorf("a stream upgrade with %s = %d", a.what, resp.StatusCode)
		}
	}
	if names, err := f.ListAllNames(t.Context()); err != nil || len(names) != 0 {
		t.Fatalf("the refusals made sandboxes: %v %v", names, err)
	}
	if resp, b := do("POST", "/ui/v1/sandboxes", ts.URL, alice, tok, create); resp.StatusCode != 201 {
		t.Fatalf("the good create = %d %s", resp.StatusCode, b)
	}
	// The API's errors come through as they are.
	if resp, b := do("GET", "/ui/v1/sandboxes/nope", "", alice, "", ""); resp.StatusCode != 404 || !strings.Contains(b, `"kind":"not_found"`) {
		t.Errorf("a missing sandbox = %d %s", resp.StatusCode, b)
	}
	if resp, _ := do("GET", "/ui/v1/sandboxes", "", "", "", ""); resp.StatusCode != 401 {
		t.Errorf("no session = %d", resp.StatusCode)
	}
	if resp, _ := do("GET", "/", "", "", "", ""); resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("the page's headers: %d %v", resp.StatusCode, resp.Header)
	}
}
