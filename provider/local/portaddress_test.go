package local

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// TestPortAddress: on the jail and on runc, a sandbox made with Publish
// has PublishedPorts, a PortAddress (unix:PATH, what a platform
// proxies) and a PublicURL (http://127.0.0.1:PORT, this user's) through
// both of which its application answers, while another local user (uid
// 65534) gets nothing through either; a port it does not publish is
// Invalid{port}; suspended, it is Unavailable{not_running} at once
// (its application would not answer), and reachable again once resumed.
func TestPortAddress(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve inside the sandbox")
	for _, mech := range []string{"jail", "oci"} {
		t.Run(mech, func(t *testing.T) {
			if mech == "oci" {
				_, err := exec.LookPath("runc")
				testenv.Require(t, err == nil, "runc is not installed (apt-get install runc)")
			}
			p := newLocal(t, mech, false)
			ctx := context.Background()
			if !p.Capabilities().Has(sandbox.CapPublicURL) {
				t.Fatalf("public_url not advertised on %s", mech)
			}
			h, err := p.Create(ctx, "web", sandbox.CreateOptions{Publish: []int{8080, 8081}})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.WriteFile(ctx, h, "index.html", []byte("hello from "+mech+"\n"), sandbox.WriteFileOptions{}); err != nil {
				t.Fatal(err)
			}
			cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "/usr/bin/python3", Args: []string{"-m", "http.server", "8080", "--bind", "127.0.0.1"}}, sandbox.SpawnOptions{Detachable: true})
			if err != nil {
				t.Fatal(err)
			}
			defer cmd.Stop()
			defer p.TerminateSession(context.Background(), h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force})
			if ports, err := p.PublishedPorts(ctx, h); err != nil || !slices.Equal(ports, []int{8080, 8081}) {
				t.Fatalf("PublishedPorts = %v, %v", ports, err)
			}
			addr, err := p.PortAddress(ctx, h, 8080)
			sock, isUnix := strings.CutPrefix(addr, "unix:")
			if err != nil || !isUnix {
				t.Fatalf("PortAddress = %q, %v; want unix:PATH", addr, err)
			}
			u, err := p.PublicURL(ctx, h)
			if err != nil || !strings.HasPrefix(u, "http://127.0.0.1:") {
				t.Fatalf("PublicURL = %q, %v; want http://127.0.0.1:PORT", u, err)
			}
			overUnix := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}}}
			defer overUnix.CloseIdleConnections()
			get := func(c *http.Client, u string) string {
				var body string
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					resp, err := c.Get(u)
					if err != nil {
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
			if body := get(overUnix, "http://localhost:8080/index.html"); body != "hello from "+mech+"\n" {
				t.Fatalf("GET through PortAddress = %q", body)
			}
			if body := get(http.DefaultClient, u+"/index.html"); body != "hello from "+mech+"\n" {
				t.Fatalf("GET through PublicURL = %q", body)
			}
			// Another local user reaches neither.
			for _, target := range []string{"unix " + sock, "tcp " + strings.TrimPrefix(u, "http://")} {
				if got := otherUserGet(t, target); got != "refused" {
					t.Errorf("uid 65534 through %s: %s; want refused", target, got)
				}
			}
			if _, err := p.PortAddress(ctx, h, 9999); !isInvalid(err) {
				t.Errorf("PortAddress of a port not published = %v, want Invalid", err)
			}
			if err := p.Suspend(ctx, h); err != nil {
				t.Fatal(err)
			}
			if _, err := p.PortAddress(ctx, h, 8080); sandbox.Kind(err) != "unavailable" || !strings.Contains(err.Error(), "not_running") {
				t.Errorf("PortAddress of a suspended sandbox = %v, want Unavailable{not_running}", err)
			}
			if _, err := p.Resume(ctx, h); err != nil {
				t.Fatal(err)
			}
			if a, err := p.PortAddress(ctx, h, 8080); err != nil || a == "" {
				t.Errorf("PortAddress once resumed = %q, %v", a, err)
			}
		})
	}
}

// otherUserGet asks for /index.html as uid 65534 ("unix PATH" or "tcp
// HOST:PORT", through python3): "refused" when it got nothing, else
// what it got.
func otherUserGet(t *testing.T, target string) string {
	t.Helper()
	network, addr, _ := strings.Cut(target, " ")
	script := `
import socket, sys
net, addr = sys.argv[1], sys.argv[2]
try:
    if net == "unix":
        s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(addr)
    else:
        h, p = addr.rsplit(":", 1)
        s = socket.create_connection((h, int(p)), timeout=3)
    s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
    got = s.recv(4096)
    print("got %r" % got if got else "refused")
except OSError as e:
    print("refused")
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, network, addr)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 as uid 65534: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}
