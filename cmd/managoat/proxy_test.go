package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// appPy is the application the proxy test serves inside a jail sandbox
// on port 8080: /headers answers the request's headers as JSON; /stream
// sends a first chunk, then the last only once the file go-on exists (so
// the first can only have arrived before the end); a request asking to
// upgrade to "echo" is switched and its bytes echoed back.
const appPy = `
import http.server, json, os, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.headers.get("Upgrade") == "echo":
            self.send_response(101); self.send_header("Upgrade", "echo"); self.send_header("Connection", "Upgrade"); self.end_headers(); self.wfile.flush()
            while True:
                b = self.rfile.read1(4096)
                if not b: return
                self.wfile.write(b); self.wfile.flush()
        if self.path == "/stream":
            self.send_response(200); self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
            def chunk(b): self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b)); self.wfile.flush()
            chunk(b"first\n")
            while not os.path.exists("go-on"): time.sleep(0.02)
            chunk(b"last\n"); self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
            return
        b = json.dumps({k: v for k, v in self.headers.items()}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
http.server.ThreadingHTTPServer(("127.0.0.1", 8080), H).serve_forever()
`

// TestPlatformProxiesAPort: through `managoat serve` on the jail, a
// sandbox created with --publish 8080 has `managoat url` the platform's
// proxy of that port; an application served inside gets the account's
// requests without the Authorization header (X-Forwarded-For set), a
// streamed answer arrives part by part, an upgrade is relayed both
// ways; no key is 401, another account's key 404 not_found; suspended,
// the URL answers 503 not_running at once, and again once resumed.
func TestPlatformProxiesAPort(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve inside the sandbox")
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_RUNNERS_ENABLED=false"}
	keys := map[string]string{}
	for _, who := range []string{"alice", "bob"} {
		if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", who); code != 0 {
			t.Fatalf("account create %s: %d %s", who, code, e)
		}
		out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", who)
		if code != 0 {
			t.Fatalf("key create %s: %d %s", who, code, e)
		}
		keys[who] = strings.TrimSpace(out)
	}
	startServe(t, base, addr)
	alice := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+keys["alice"])
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, e, code := managoatEnv(t, alice, "create", "--publish", "8080", "web")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create --publish 8080 web: %d %s", code, e)
		}
	}
	t.Cleanup(func() { managoatEnv(t, alice, "rm", "-f", "web") })
	if _, e, code := managoatEnv(t, alice, "spawn", "--detach", "web", "--", "/usr/bin/python3", "-c", appPy); code != 0 {
		t.Fatalf("spawn the application: %d %s", code, e)
	}
	url, e, code := managoatEnv(t, alice, "url", "web")
	want := "http://" + addr + "/v1/sandboxes/web/ports/8080/"
	if code != 0 || strings.TrimSpace(url) != want {
		t.Fatalf("managoat url web = %d %q %s, want %s", code, url, e, want)
	}
	hc := &http.Client{Timeout: 20 * time.Second} // a hang fails instead of stalling
	do := func(method, path, key string, h http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, want+path, nil)
		for k, v := range h {
			req.Header[k] = v
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var headers map[string]string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp := do("GET", "headers", keys["alice"], nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(b, &headers); err != nil {
				t.Fatalf("headers: %s", b)
			}
			break
		}
		if time.Now().After(deadline) { // the application is starting meanwhile: 502
			t.Fatalf("GET headers = %d %s", resp.StatusCode, b)
		}
	}
	for k, v := range headers {
		if strings.EqualFold(k, "Authorization") || strings.Contains(v, keys["alice"]) {
			t.Errorf("the application saw the key: %s: %s", k, v)
		}
	}
	if headers["X-Forwarded-For"] != "127.0.0.1" || headers["X-Forwarded-Prefix"] != "/v1/sandboxes/web/ports/8080" {
		t.Errorf("the application's headers: %v", headers)
	}

	resp := do("GET", "stream", keys["alice"], nil)
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("the stream's first part = %q, %v", line, err)
	}
	if _, e, code := managoatEnv(t, alice, "exec", "web", "--", "touch", "go-on"); code != 0 {
		t.Fatalf("touch go-on: %d %s", code, e)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "last\n" {
		t.Errorf("the stream's rest = %q", rest)
	}
	resp.Body.Close()

	// A client without a Timeout: its body is then the connection itself.
	uctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(uctx, "GET", want+"up", nil)
	req.Header = http.Header{"Connection": {"Upgrade"}, "Upgrade": {"echo"}, "Authorization": {"Bearer " + keys["alice"]}}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade = %d %s", resp.StatusCode, b)
	}
	rw := resp.Body.(io.ReadWriteCloser)
	for _, m := range []string{"ping\n", "again\n"} {
		if _, err := io.WriteString(rw, m); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, len(m))
		if _, err := io.ReadFull(rw, b); err != nil || string(b) != m {
			t.Fatalf("echo through the upgrade = %q, %v", b, err)
		}
	}
	rw.Close()

	for who, wantStatus := range map[string]int{"": 401, keys["bob"]: 404} {
		resp := do("GET", "headers", who, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Errorf("with key %.8q: %d %s, want %d", who, resp.StatusCode, b, wantStatus)
		}
	}

	if _, e, code := managoatEnv(t, alice, "suspend", "web"); code != 0 {
		t.Fatalf("suspend: %d %s", code, e)
	}
	resp = do("GET", "headers", keys["alice"], nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "not_running") {
		t.Errorf("a suspended sandbox's URL = %d %s, want 503 not_running", resp.StatusCode, b)
	}
	if _, e, code := managoatEnv(t, alice, "resume", "web"); code != 0 {
		t.Fatalf("resume: %d %s", code, e)
	}
	resp = do("GET", "headers", keys["alice"], nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("once resumed = %d", resp.StatusCode)
	}
}
