package main

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
)

// TestServeQuotaFlags: --runners-per-account bounds the runner names an
// account holds (one more is 403 resource_exhausted), `serve admin runner
// ls` lists the names and who holds each, `runner rm` frees one (beside
// the running serve); a bound under 1 is a usage error; serve logs the
// default provider and why at start (a warning: local is off).
func TestServeQuotaFlags(t *testing.T) {
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_LOCAL_ENABLED=false",
		"SPRITES_TOKEN=", "E2B_API_KEY=", "DAYTONA_API_KEY=", "SANDBOX_PROVIDER="}
	if _, e, code := managoatEnv(t, base, "serve", "--sandboxes-per-account", "0"); code != 2 || !strings.Contains(e, "--sandboxes-per-account") {
		t.Fatalf("--sandboxes-per-account 0: %d %s, want a usage error naming it", code, e)
	}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Fatalf("account create: %d %s", code, e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "me")
	if code != 0 {
		t.Fatalf("key create: %d %s", code, e)
	}
	key = strings.TrimSpace(key)
	_, logs := startServeCmd(t, base, addr, "--runners-per-account", "1")
	dial := func(name string) (int, string) {
		t.Helper()
		u := "ws://" + addr + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}}.Encode()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
			cancel()
			if err == nil {
				_ = ws.CloseNow()
				return 101, ""
			}
			if resp != nil {
				b := make([]byte, 2048)
				n, _ := resp.Body.Read(b)
				return resp.StatusCode, string(b[:n])
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	if st, body := dial("r1"); st != 101 {
		t.Fatalf("r1: %d %s", st, body)
	}
	if st, body := dial("r2"); st != http.StatusForbidden || !strings.Contains(body, "resource_exhausted") {
		t.Fatalf("r2 past --runners-per-account 1: %d %s, want 403 resource_exhausted", st, body)
	}
	out, e, code := managoatEnv(t, base, "serve", "admin", "runner", "ls", "me")
	if code != 0 || !strings.Contains(out, "r1") || !strings.Contains(out, "key ") || strings.Contains(out, "r2") {
		t.Fatalf("runner ls: %d %q %s", code, out, e)
	}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "runner", "rm", "me", "r1"); code != 0 {
		t.Fatalf("runner rm: %d %s", code, e)
	}
	if st, body := dial("r2"); st != 101 {
		t.Fatalf("r2 after r1 was freed: %d %s", st, body)
	}
	// With local off, the default is said at start, loudly, with why.
	if l := logs(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "default=runner") || !strings.Contains(l, "SANDBOX_LOCAL_ENABLED is false") {
		t.Fatalf("serve's log does not say the default provider and why:\n%s", l)
	}
}
