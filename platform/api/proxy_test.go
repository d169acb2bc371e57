package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// publisher is provider/fake whose sandboxes publish ports as
// provider/local's do: each published port of a sandbox is a real HTTP
// server on this host's loopback (app), reached at PortAddress while the
// sandbox is not stopped.
type publisher struct {
	*fake.Provider
	addr string // where every published port answers

	mu      sync.Mutex
	ports   map[string][]int // by provider name
	stopped bool
}

func (p *publisher) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	h, err := p.Provider.Create(ctx, name, o)
	if err == nil {
		p.mu.Lock()
		p.ports[name] = o.Publish
		p.mu.Unlock()
	}
	return h, err
}

func (p *publisher) PublishedPorts(_ context.Context, h *sandbox.Handle) ([]int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ports[h.Name], nil
}

func (p *publisher) PortAddress(_ context.Context, h *sandbox.Handle, port int) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	published := false
	for _, q := range p.ports[h.Name] {
		published = published || q == port
	}
	switch {
	case !published:
		return "", sandbox.Invalid("port", fmt.Sprintf("port %d is not published", port))
	case p.stopped:
		return "", sandbox.Unavailable("not_running", errors.New("the sandbox is not running"))
	case port == 9000:
		// Published, but nothing listens: a listener closed at once.
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		ln.Close()
		return ln.Addr().String(), nil
	}
	return p.addr, nil
}

// noServerPanics fails t when an HTTP server of the test (the platform's
// or the application's, which log through the standard logger) recovered
// a panic of a handler or of its connection.
func noServerPanics(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	log.SetOutput(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }))
	t.Cleanup(func() { // after the servers' cleanups (registered later, run first)
		log.SetOutput(os.Stderr)
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(buf.String(), "panic") {
			t.Errorf("an HTTP server panicked:\n%s", buf.String())
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// seen is what the application saw of the last request.
type seen struct {
	mu     sync.Mutex
	header http.Header
	uri    string
}

// proxied starts an application, a platform with a publisher over it,
// and alice's sandbox "web" publishing 8080 and 9000.
func proxied(t *testing.T, app http.Handler, configure func(*api.Config)) (pl *apitest.Platform, pub *publisher, alice, bob string) {
	t.Helper()
	ts := httptest.NewServer(app)
	t.Cleanup(ts.Close)
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pub = &publisher{Provider: f, addr: ts.Listener.Addr().String(), ports: map[string][]int{}}
	pl = apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": pub}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}, Configure: configure})
	alice, bob = pl.Account(t, "alice"), pl.Account(t, "bob")
	a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "web", "publish": [8080, 9000]}`))
	if a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	return pl, pub, alice, bob
}

// TestProxyAuthorizedAsTheAPI: the sandbox's url is the platform's proxy
// of its first port, and GET url says the same; the account's key
// reaches the application, which never sees the Authorization header but
// gets X-Forwarded-*, the path and query as sent, and no hop-by-hop
// header; no key is 401, another account's key 404 not_found (and its
// own sandbox of the same name is its own); a port not published is
// 400, one nothing listens on 502, a port out of range 400; a create
// publishing on a provider that cannot is refused.
func TestProxyAuthorizedAsTheAPI(t *testing.T) {
	var s seen
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.header, s.uri = r.Header.Clone(), r.RequestURI
		s.mu.Unlock()
		fmt.Fprintf(w, "app: %s %s", r.Method, r.URL.Path)
	})
	pl, _, alice, bob := proxied(t, app, nil)
	want := pl.URL + "/v1/sandboxes/web/ports/8080/"
	var v api.Sandbox
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/web", alice, nil); json.Unmarshal(a.body, &v) != nil || v.URL != want {
		t.Fatalf("url = %q (%s), want %q", v.URL, a.body, want)
	}
	if u := call(t, "GET", pl.URL+"/v1/sandboxes/web/url", alice, nil); u.status != 200 || !strings.Contains(string(u.body), want) {
		t.Fatalf("GET url = %d %s", u.status, u.body)
	}
	c := newPlatformClient(t, pl, alice)
	if u, err := c.PublicURL(t.Context(), sandbox.BuildHandle("platform", "web")); err != nil || u != want {
		t.Fatalf("client PublicURL = %q, %v", u, err)
	}

	req, _ := http.NewRequest("POST", want+"a/b%2Fc?x=1&y=2", strings.NewReader("body"))
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("X-Forwarded-For", "6.6.6.6") // a caller's claim is not kept
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "must not pass")
	req.Header.Set("X-App", "passes")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "app: POST /a/b/c" {
		t.Fatalf("POST through the proxy = %d %q", resp.StatusCode, b)
	}
	s.mu.Lock()
	h, uri := s.header, s.uri
	s.mu.Unlock()
	if uri != "/a/b%2Fc?x=1&y=2" {
		t.Errorf("the application got %q, want /a/b%%2Fc?x=1&y=2", uri)
	}
	if got := h.Get("Authorization"); got != "" {
		t.Errorf("the application saw Authorization %q", got)
	}
	if strings.Contains(fmt.Sprint(h), alice) {
		t.Errorf("the key reached the application: %v", h)
	}
	if h.Get("X-Forwarded-For") != "127.0.0.1" || h.Get("X-Forwarded-Host") != strings.TrimPrefix(pl.URL, "http://") ||
		h.Get("X-Forwarded-Proto") != "http" || h.Get("X-Forwarded-Prefix") != "/v1/sandboxes/web/ports/8080" {
		t.Errorf("X-Forwarded-*: %v", h)
	}
	if h.Get("X-Hop") != "" || h.Get("X-App") != "passes" {
		t.Errorf("hop-by-hop X-Hop %q, X-App %q", h.Get("X-Hop"), h.Get("X-App"))
	}

	// The port's root without its slash is redirected to it (before any
	// key is asked: the redirect says nothing); HEAD is GET's.
	nofollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if resp, err := nofollow.Get(strings.TrimSuffix(want, "/")); err != nil || resp.StatusCode != 307 || resp.Header.Get("Location") != "/v1/sandboxes/web/ports/8080/" {
		t.Errorf("the port without its slash = %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if a := call(t, "HEAD", want+"x", alice, nil); a.status != 200 || a.header.Get("Content-Length") != "12" { // "app: HEAD /x"
		t.Errorf("HEAD = %d %v", a.status, a.header)
	}
	if a := call(t, "GET", want, "", nil); a.status != 401 {
		t.Errorf("no key = %d %s, want 401", a.status, a.body)
	}
	if a := call(t, "GET", want, "mgk_forged", nil); a.status != 401 {
		t.Errorf("a forged key = %d %s, want 401", a.status, a.body)
	}
	if a := call(t, "GET", want, bob, nil); a.status != 404 || a.err == nil || a.err.Kind != "not_found" {
		t.Errorf("another account's key = %d %s, want 404 not_found", a.status, a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/web/ports/8081/", alice, nil); a.status != 400 || a.err.Reason != "port" {
		t.Errorf("a port not published = %d %s, want 400 invalid{port}", a.status, a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/web/ports/70000/", alice, nil); a.status != 400 {
		t.Errorf("port 70000 = %d %s, want 400", a.status, a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/web/ports/9000/", alice, nil); a.status != 502 || a.err.Reason != "port_unreachable" {
		t.Errorf("a port nothing listens on = %d %s, want 502 port_unreachable", a.status, a.body)
	}
	// A sandbox that publishes nothing has no url, and says why.
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "bare"}`)); a.status != 201 || strings.Contains(string(a.body), `"url"`) {
		t.Errorf("a sandbox publishing nothing = %d %s, want no url", a.status, a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/bare/url", alice, nil); a.status != 400 || a.err.Reason != "no_published_port" {
		t.Errorf("GET url of a sandbox publishing nothing = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "w2", "publish": [0]}`)); a.status != 400 {
		t.Errorf("publish 0 = %d %s", a.status, a.body)
	}
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	plain := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	k := plain.Account(t, "carol")
	if a := call(t, "POST", plain.URL+"/v1/sandboxes", k, strings.NewReader(`{"name": "w", "publish": [8080]}`)); a.status != 400 || a.err.Field != "" && a.err.Reason != "publish" {
		t.Errorf("publish on a provider that cannot = %d %s, want 400 invalid{publish}", a.status, a.body)
	}
	call(t, "POST", plain.URL+"/v1/sandboxes", k, strings.NewReader(`{"name": "w"}`))
	if a := call(t, "GET", plain.URL+"/v1/sandboxes/w/ports/8080/", k, nil); a.status != 501 {
		t.Errorf("the proxy on a provider that cannot = %d %s, want 501", a.status, a.body)
	}
}

// TestProxyStreams: a response arrives part by part before its end, and
// a request body streams to the application while its answer streams
// back (an echo, line by line).
func TestProxyStreams(t *testing.T) {
	noServerPanics(t)
	release := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		switch r.URL.Path {
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: first\n\n")
			_ = rc.Flush()
			<-release // the end comes only once the client read the first part
			fmt.Fprint(w, "data: last\n\n")
		case "/echo":
			_ = rc.EnableFullDuplex()
			w.WriteHeader(200)
			_ = rc.Flush()
			sc := bufio.NewScanner(r.Body)
			for sc.Scan() {
				fmt.Fprintf(w, "echo %s\n", sc.Text())
				_ = rc.Flush()
			}
		}
	})
	pl, _, alice, _ := proxied(t, app, nil)
	base := pl.URL + "/v1/sandboxes/web/ports/8080"
	req, _ := http.NewRequest("GET", base+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first event = %q, %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "\ndata: last\n\n" {
		t.Fatalf("rest = %q", rest)
	}

	pr, pw := io.Pipe()
	req, _ = http.NewRequest("POST", base+"/echo", pr)
	req.Header.Set("Authorization", "Bearer "+alice)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br = bufio.NewReader(resp.Body)
	for _, line := range []string{"one", "two", "three"} {
		fmt.Fprintln(pw, line) // the next line is written only once this one came back
		if got, err := br.ReadString('\n'); err != nil || got != "echo "+line+"\n" {
			t.Fatalf("echo of %q = %q, %v", line, got, err)
		}
	}
	pw.Close()
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("after the end: %q", rest)
	}
}

// TestProxyWebSocket: an upgrade goes through (messages both ways),
// without the key; Close of the platform ends the relayed connection.
func TestProxyWebSocket(t *testing.T) {
	var s seen
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.header = r.Header.Clone()
		s.mu.Unlock()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo "), b...)); err != nil {
				return
			}
		}
	})
	pl, _, alice, _ := proxied(t, app, nil)
	ctx := t.Context()
	c, resp, err := websocket.Dial(ctx, strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/web/ports/8080/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + alice}}})
	if err != nil {
		t.Fatalf("dial through the proxy: %v (%v)", err, resp)
	}
	defer c.CloseNow()
	for _, m := range []string{"hello", "again"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
		if _, b, err := c.Read(ctx); err != nil || string(b) != "echo "+m {
			t.Fatalf("read = %q, %v", b, err)
		}
	}
	s.mu.Lock()
	if s.header.Get("Authorization") != "" || s.header.Get("Upgrade") != "websocket" {
		t.Errorf("the application's upgrade request: %v", s.header)
	}
	s.mu.Unlock()
	if _, _, err := websocket.Dial(ctx, strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/web/ports/8080/ws", nil); err == nil {
		t.Errorf("an upgrade without a key went through")
	}
	pl.API.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := c.Read(rctx); err == nil || rctx.Err() != nil {
		t.Errorf("after the platform's Close the relayed connection = %v (context %v)", err, rctx.Err())
	}
}

// TestProxyBounds: the per-sandbox cap on proxied connections holds (the
// next is 429 until one ends, and another sandbox is not affected); a
// body over the limit is 413 (declared, or streamed), and the client's
// next request (on the connection it reuses) is answered; an application
// silent for the idle bound is 504; a caller that reads nothing of an
// answer, or of an upgraded connection, frees its slot after that bound; a stopped sandbox is 503
// unavailable{not_running} at once.
func TestProxyBounds(t *testing.T) {
	noServerPanics(t)
	hold := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold":
			w.WriteHeader(200)
			_ = http.NewResponseController(w).Flush()
			<-hold
		case "/silent":
			time.Sleep(2 * time.Second)
		case "/endless":
			chunk := make([]byte, 64<<10)
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/ws":
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			_, _, _ = c.Read(context.Background()) // says nothing; ends when the proxy closes

		case "/read":
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
		default:
			fmt.Fprint(w, "ok")
		}
	})
	pl, pub, alice, _ := proxied(t, app, func(c *api.Config) {
		c.ProxyMaxConns, c.ProxyMaxBody, c.ProxyIdle = 2, 1024, 300*time.Millisecond
	})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release) // before the platform's cleanup, which waits for the held handlers
	base := pl.URL + "/v1/sandboxes/web/ports/8080"
	get := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+alice)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	held := []*http.Response{get("/hold"), get("/hold")}
	if a := call(t, "GET", base+"/", alice, nil); a.status != 429 || a.err.Reason != "proxy_connections" || a.header.Get("Retry-After") == "" {
		t.Fatalf("a third connection = %d %s, want 429 proxy_connections", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "other", "publish": [8080]}`)); a.status != 201 {
		t.Fatal(a.status, string(a.body))
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/other/ports/8080/", alice, nil); a.status != 200 {
		t.Errorf("another sandbox while web is at its cap = %d %s", a.status, a.body)
	}
	release()
	for _, r := range held {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	var after answer
	for range 100 { // the held handlers release their slots as they return
		if after = call(t, "GET", base+"/", alice, nil); after.status != 429 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after.status != 200 || string(after.body) != "ok" {
		t.Errorf("once they ended = %d %s", after.status, after.body)
	}

	if a := call(t, "POST", base+"/read", alice, bytes.NewReader(make([]byte, 1024))); a.status != 200 || string(a.body) != "1024" {
		t.Errorf("a body at the limit = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", base+"/read", alice, bytes.NewReader(make([]byte, 1025))); a.status != 413 {
		t.Errorf("a declared body over the limit = %d %s, want 413", a.status, a.body)
	}
	if a := call(t, "POST", base+"/read", alice, io.MultiReader(bytes.NewReader(make([]byte, 4096)))); a.status != 413 {
		t.Errorf("a streamed body over the limit = %d %s, want 413", a.status, a.body)
	}
	if a := call(t, "GET", base+"/silent", alice, nil); a.status != 504 || a.err.Reason != "proxy_idle_timeout" {
		t.Errorf("a silent application = %d %s, want 504 proxy_idle_timeout", a.status, a.body)
	}

	// A caller that takes nothing of an answer frees its slot after the
	// idle bound, and so does an upgraded connection where nothing moves.
	acct, err := pl.Store.AccountByName(t.Context(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	stuck := get("/endless") // its body is never read
	defer stuck.Body.Close()
	ws, _, err := websocket.Dial(t.Context(), strings.Replace(base, "http", "ws", 1)+"/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + alice}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	rctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, _, err := ws.Read(rctx); err == nil || rctx.Err() != nil {
		t.Errorf("an idle upgraded connection = %v (context %v), want closed by the proxy", err, rctx.Err())
	}
	for deadline := time.Now().Add(10 * time.Second); pl.API.ProxyConns(acct.ID, "web") > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d proxied connections still held by callers that take nothing", pl.API.ProxyConns(acct.ID, "web"))
		}
	}

	pub.mu.Lock()
	pub.stopped = true
	pub.mu.Unlock()
	hc := &http.Client{Timeout: 10 * time.Second} // a hang fails the test instead of stalling it
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("a stopped sandbox: %v", err)
	}
	_ = resp
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "not_running") {
		t.Errorf("a stopped sandbox = %d %s, want 503 not_running", resp.StatusCode, b)
	}
}

// TestProxyUnixSocket: a port published on a unix socket (PortAddress
// "unix:PATH", as provider/local's are) is proxied there, keep-alive
// connections and all, with the key's authorization; the application
// sees Host localhost:PORT.
func TestProxyUnixSocket(t *testing.T) {
	noServerPanics(t)
	sock := filepath.Join(t.TempDir(), "app.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var hosts []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		fmt.Fprintf(w, "unix app: %s", r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pub := &publisher{Provider: f, addr: "unix:" + sock, ports: map[string][]int{}}
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": pub}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	alice := pl.Account(t, "alice")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "web", "publish": [8080]}`)); a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	u := pl.URL + "/v1/sandboxes/web/ports/8080/"
	for i := range 3 {
		if a := call(t, "GET", u+fmt.Sprint("p", i), alice, nil); a.status != 200 || string(a.body) != fmt.Sprint("unix app: /p", i) {
			t.Fatalf("GET %d through the unix socket = %d %q", i, a.status, a.body)
		}
	}
	if a := call(t, "GET", u, "", nil); a.status != 401 {
		t.Errorf("no key = %d, want 401", a.status)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range hosts {
		if h != "localhost:8080" {
			t.Errorf("the application saw Host %q, want localhost:8080", h)
		}
	}
}
