package api_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
)

// browser is an HTTP client that reaches the platform at addr whatever
// host a URL names (as a browser resolves *.localhost to loopback), and
// follows no redirect.
func browser(addr string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// previewLink asks for a preview link of port of name with key.
func previewLink(t *testing.T, base, key, name string, port, ttl int) api.PreviewURL {
	t.Helper()
	body, _ := json.Marshal(api.PreviewRequest{Port: port, TTLSeconds: ttl})
	a := call(t, "POST", base+"/v1/sandboxes/"+name+"/preview", key, strings.NewReader(string(body)))
	var v api.PreviewURL
	if a.status != 200 || json.Unmarshal(a.body, &v) != nil {
		t.Fatalf("preview of %s:%d = %d %s", name, port, a.status, a.body)
	}
	return v
}

// get sends GET u with the cookie (if any).
func get(t *testing.T, hc *http.Client, u string, cookie *http.Cookie) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	req.AddCookie(&http.Cookie{Name: "app", Value: "own"})
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// exchange opens a link and returns the cookie it sets.
func exchange(t *testing.T, hc *http.Client, link string) *http.Cookie {
	t.Helper()
	resp := get(t, hc, link, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("open %s = %d %v", link, resp.StatusCode, resp.Header)
	}
	for _, c := range resp.Cookies() {
		if c.Name == api.PreviewCookie {
			if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Domain != "" || c.Secure {
				t.Fatalf("the cookie: %+v (want HttpOnly, SameSite=Lax, Path=/, host-only, not Secure over http)", c)
			}
			return c
		}
	}
	t.Fatalf("open %s set no cookie: %v", link, resp.Header)
	return nil
}

// TestPreviewURLOpensInABrowser: a preview link of a published port,
// opened as a browser does, is exchanged on the preview's own origin for
// a cookie of that host only, with which requests (and a WebSocket) reach
// the application, which sees neither the cookie nor a key, and its own
// cookies as sent (fails on the old code: no preview route, 404).
func TestPreviewURLOpensInABrowser(t *testing.T) {
	var mu sync.Mutex
	var last http.Header
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = r.Header.Clone()
		mu.Unlock()
		if r.URL.Path == "/ws" {
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err != nil {
				return
			}
			defer c.CloseNow()
			typ, b, err := c.Read(r.Context())
			if err == nil {
				_ = c.Write(r.Context(), typ, append([]byte("echo "), b...))
			}
			return
		}
		_, _ = io.WriteString(w, "app at "+r.URL.Path)
	})
	pl, _, alice, _ := proxied(t, app, nil)
	link := previewLink(t, pl.URL, alice, "web", 8080, 0)
	u, err := url.Parse(link.URL)
	if err != nil || !strings.HasSuffix(u.Hostname(), ".localhost") || !strings.HasPrefix(u.Hostname(), "p8080-") || u.Path != api.PreviewExchangePath {
		t.Fatalf("link = %q", link.URL)
	}
	if until := time.Until(link.ExpiresAt); until < 14*time.Minute || until > 16*time.Minute {
		t.Errorf("expires_at %v, want about 15 minutes from now", link.ExpiresAt)
	}
	hc := browser(pl.TS.Listener.Addr().String())
	cookie := exchange(t, hc, link.URL)
	req, _ := http.NewRequest("GET", link.Origin+"/some/page?q=1", nil)
	req.AddCookie(cookie)
	req.AddCookie(&http.Cookie{Name: "app", Value: "own"})
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "app at /some/page" {
		t.Fatalf("through the cookie = %d %q", resp.StatusCode, b)
	}
	mu.Lock()
	if got := last.Get("Cookie"); got != "app=own" || last.Get("Authorization") != "" || last.Get("X-Forwarded-Prefix") != "" {
		t.Errorf("the application saw Cookie %q, Authorization %q, X-Forwarded-Prefix %q", got, last.Get("Authorization"), last.Get("X-Forwarded-Prefix"))
	}
	mu.Unlock()
	ws, _, err := websocket.Dial(t.Context(), strings.Replace(link.Origin, "http", "ws", 1)+"/ws", &websocket.DialOptions{
		HTTPClient: hc, HTTPHeader: http.Header{"Cookie": {cookie.String()}}})
	if err != nil {
		t.Fatalf("WebSocket through the preview: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(t.Context(), websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, m, err := ws.Read(t.Context()); err != nil || string(m) != "echo hi" {
		t.Fatalf("WebSocket read %q, %v", m, err)
	}
	// The API is not served on a preview's origin: a key there is nothing.
	req, _ = http.NewRequest("GET", link.Origin+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the API on a preview's origin = %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// tamper changes the payload of a token (its port) and keeps the
// signature.
func tamper(t *testing.T, tok string) string {
	payload, sig, _ := strings.Cut(tok, ".")
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["p"] = 9000
	b, _ = json.Marshal(m)
	return base64.RawURLEncoding.EncodeToString(b) + "." + sig
}

// TestPreviewRefusals performs the attacks on preview links and cookies
// and sees each refused 401 with nothing proxied: an expired link and an
// expired cookie; sandbox A's link and cookie on B's origin; another
// account's (bob's own "web"); a tampered token (payload changed, or the
// signature); a cookie of port 8080 replayed on 9000's origin; a link as
// a cookie and a cookie as a link; a link and a cookie of a revoked key;
// a cookie of a sandbox deleted and made again under its name; a link of
// a port the sandbox does not publish is not even made (fails on the old
// code: no preview route).
func TestPreviewRefusals(t *testing.T) {
	var hits atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "app")
	})
	var offset atomic.Int64
	clock := func(c *api.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		c.FailedAuthBurst = 1000 // the refusals below are counted as failed authentications
	}
	pl, _, alice, bob := proxied(t, app, clock)
	for _, c := range []struct{ key, body string }{
		{alice, `{"name": "other", "publish": [8080]}`},
		{bob, `{"name": "web", "publish": [8080, 9000]}`},
	} {
		if a := call(t, "POST", pl.URL+"/v1/sandboxes", c.key, strings.NewReader(c.body)); a.status != 201 {
			t.Fatalf("create %s = %d %s", c.body, a.status, a.body)
		}
	}
	hc := browser(pl.TS.Listener.Addr().String())
	web := previewLink(t, pl.URL, alice, "web", 8080, 60)
	web9000 := previewLink(t, pl.URL, alice, "web", 9000, 0)
	other := previewLink(t, pl.URL, alice, "other", 8080, 0)
	bobs := previewLink(t, pl.URL, bob, "web", 8080, 0)
	if bobs.Origin == web.Origin || other.Origin == web.Origin || web9000.Origin == web.Origin {
		t.Fatalf("two previews share an origin: %s %s %s %s", web.Origin, web9000.Origin, other.Origin, bobs.Origin)
	}
	cookie := exchange(t, hc, web.URL)
	if resp := get(t, hc, web.Origin+"/", cookie); resp.StatusCode != 200 {
		t.Fatalf("the good cookie = %d", resp.StatusCode)
	}
	tokenOf := func(link string) string { u, _ := url.Parse(link); return u.Query().Get("token") }
	linkOn := func(origin, tok string) string {
		return origin + api.PreviewExchangePath + "?token=" + url.QueryEscape(tok)
	}
	tok := tokenOf(web.URL)
	flipped := []byte(tok)
	flipped[len(flipped)-2] ^= 1
	refused := func(what string, resp *http.Response) {
		t.Helper()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s = %d, want 401", what, resp.StatusCode)
		}
		for _, c := range resp.Cookies() {
			if c.Name == api.PreviewCookie {
				t.Errorf("%s set a cookie", what)
			}
		}
	}
	before := hits.Load()
	refused("A's link on B's origin", get(t, hc, linkOn(other.Origin, tok), nil))
	refused("alice's link on bob's origin", get(t, hc, linkOn(bobs.Origin, tok), nil))
	refused("bob's link on alice's origin", get(t, hc, linkOn(web.Origin, tokenOf(bobs.URL)), nil))
	refused("A's cookie on B's origin", get(t, hc, other.Origin+"/", cookie))
	refused("alice's cookie on bob's origin", get(t, hc, bobs.Origin+"/", cookie))
	refused("the 8080 cookie on 9000's origin", get(t, hc, web9000.Origin+"/", cookie))
	refused("a tampered payload", get(t, hc, linkOn(web9000.Origin, tamper(t, tok)), nil))
	refused("a tampered signature", get(t, hc, linkOn(web.Origin, string(flipped)), nil))
	refused("a tampered cookie", get(t, hc, web9000.Origin+"/", &http.Cookie{Name: api.PreviewCookie, Value: tamper(t, cookie.Value)}))
	refused("a link as a cookie", get(t, hc, web.Origin+"/", &http.Cookie{Name: api.PreviewCookie, Value: tok}))
	refused("a cookie as a link", get(t, hc, linkOn(web.Origin, cookie.Value), nil))
	refused("no cookie", get(t, hc, web.Origin+"/", nil))
	refused("garbage", get(t, hc, linkOn(web.Origin, "x.y"), nil))
	// Expiry: the link after its 60 s, the cookie after its hour.
	offset.Store(int64(61 * time.Second))
	refused("an expired link", get(t, hc, web.URL, nil))
	if resp := get(t, hc, web.Origin+"/", cookie); resp.StatusCode != 200 {
		t.Errorf("the cookie within its hour = %d", resp.StatusCode)
	}
	offset.Store(int64(api.PreviewCookieTTL + time.Minute))
	refused("an expired cookie", get(t, hc, web.Origin+"/", cookie))
	offset.Store(0)
	if hits.Load() != before+1 {
		t.Fatalf("the application got %d requests during the refusals, want only the 1 good one", hits.Load()-before)
	}
	// A link of a port not published is not made; nor one of another
	// account's sandbox (bob has no "other").
	if a := call(t, "POST", pl.URL+"/v1/sandboxes/web/preview", alice, strings.NewReader(`{"port": 7000}`)); a.status != 400 || a.err == nil || a.err.Reason != "port" {
		t.Errorf("a link of an unpublished port = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes/other/preview", bob, strings.NewReader(`{"port": 8080}`)); a.status != 404 {
		t.Errorf("bob's link of alice's sandbox = %d %s", a.status, a.body)
	}
	// Deleted and made again: the old cookie is refused.
	otherCookie := exchange(t, hc, other.URL)
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/other", alice, nil); a.status/100 != 2 {
		t.Fatalf("delete = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "other", "publish": [8080]}`)); a.status != 201 {
		t.Fatalf("create again = %d %s", a.status, a.body)
	}
	refused("a cookie of the sandbox before it was made again", get(t, hc, other.Origin+"/", otherCookie))
	// Revoked with the key: its link and its cookie.
	fresh := previewLink(t, pl.URL, alice, "web", 8080, 0)
	if err := pl.Store.RevokeKey(t.Context(), api.KeyID(alice), time.Now()); err != nil {
		t.Fatal(err)
	}
	refused("a revoked key's cookie", get(t, hc, web.Origin+"/", cookie))
	refused("a revoked key's link", get(t, hc, fresh.URL, nil))
	if hits.Load() != before+1 {
		t.Fatalf("the application got %d requests, want 1", hits.Load()-before)
	}
}
