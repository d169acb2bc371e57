package local

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// TestPortAddress: on the jail and on runc, a sandbox made with Publish
// has PublishedPorts and a PortAddress (127.0.0.1:PORT, the PublicURL's
// host) through which its application answers; a port it does not publish
// is Invalid{port}; suspended, it is Unavailable{not_running} at once
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
			if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Fatalf("PortAddress = %q, %v; want 127.0.0.1:PORT", addr, err)
			}
			if u, err := p.PublicURL(ctx, h); err != nil || u != "http://"+addr {
				t.Errorf("PublicURL = %q, %v; want http://%s", u, err, addr)
			}
			var body string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				resp, err := http.Get("http://" + addr + "/index.html")
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if body = string(b); resp.StatusCode == 200 {
					break
				}
			}
			if body != "hello from "+mech+"\n" {
				t.Fatalf("GET through PortAddress = %q", body)
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
