package jail_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// get fetches url, polling for 10 s until it answers 200.
func get(url string) string {
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			body = err.Error()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode == 200 {
			break
		}
	}
	return body
}

// TestRootlessPublish: a jail started by a user that is not root (uid
// 65534) publishes a sandbox's ports on the host's loopback, with
// network none and with egress: a server inside is reached at Address
// (127.0.0.1 only); Address is "" for a port not published and once the
// sandbox is stopped, the port no longer answers, and nothing the
// publishing started is left after Stop and Destroy.
func TestRootlessPublish(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "needs /usr/bin/python3 to serve inside the sandbox")
	j := rootlessNetJail(t, in)
	ctx := context.Background()
	for _, network := range []string{mechanism.NetworkNone, mechanism.NetworkEgress} {
		t.Run(network, func(t *testing.T) {
			id := "pub-" + network
			started(t, j, id, mechanism.Spec{Network: network, Publish: []int{8080, 8081}})
			p, err := j.HostPath(id, "index.html")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("hello from inside\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			proc, err := j.StartProcess(ctx, id, mechanism.ProcessSpec{Argv: []string{"/usr/bin/python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer proc.Wait()
			defer proc.Signal(syscall.SIGKILL)
			addr, err := j.Address(ctx, id, 8080)
			if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Fatalf("Address = %q, %v; want 127.0.0.1:PORT", addr, err)
			}
			if body := get("http://" + addr + "/index.html"); body != "hello from inside\n" {
				t.Fatalf("GET through the published port = %q", body)
			}
			if h := egresstest.SocketHelpers(); len(h) != 1 {
				t.Errorf("socket helpers = %v, want one (both ports)", h)
			}
			// 8081 is published and nobody serves it inside.
			idle, err := j.Address(ctx, id, 8081)
			if err != nil || idle == "" {
				t.Fatalf("Address of 8081 = %q, %v", idle, err)
			}
			if resp, err := http.Get("http://" + idle + "/"); err == nil {
				resp.Body.Close()
				t.Errorf("a published port nobody serves answered %s", resp.Status)
			}
			if a, err := j.Address(ctx, id, 9999); a != "" || err != nil {
				t.Errorf("Address of a port not published = %q, %v", a, err)
			}
			if err := j.Stop(ctx, id); err != nil {
				t.Fatal(err)
			}
			if a, err := j.Address(ctx, id, 8080); a != "" || err != nil {
				t.Errorf("Address of a stopped sandbox = %q, %v", a, err)
			}
			if egress.Listening(addr) || egress.Listening(idle) {
				t.Errorf("a published port still answers after Stop")
			}
			if h := egresstest.SocketHelpers(); len(h) != 0 {
				t.Errorf("socket helpers %v left after Stop", h)
			}
			if err := j.Start(ctx, id); err != nil {
				t.Fatal(err)
			}
			if addr, _ := j.Address(ctx, id, 8080); addr == "" || !egress.Listening(addr) {
				t.Errorf("after a restart Address = %q, not listening", addr)
			}
			if err := j.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			if h := egresstest.SocketHelpers(); len(h) != 0 {
				t.Errorf("socket helpers %v left after Destroy", h)
			}
			if addr, _ := j.Address(ctx, id, 8080); addr != "" {
				t.Errorf("Address after Destroy = %q", addr)
			}
		})
	}
}
