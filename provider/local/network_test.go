package local

import (
	"context"
	"errors"
	"github.com/managoat/managoat/internal/testenv"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/sandbox"
)

// On the jail: network_policy is advertised, an allow list is put in
// force, a bad entry is Invalid naming it, a list past the limit is
// refused, and a sandbox made with network none keeps only lo (deny-all
// accepted, an allow list refused naming egress_allowlist).
func TestJailPolicy(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	if !p.Capabilities().Has(sandbox.CapNetworkPolicy) {
		t.Fatal("network_policy not advertised on the jail")
	}
	h, err := p.Create(ctx, "pol", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("deny-all: %v", err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", "*.example.org:443", "203.0.113.0/24"}}); err != nil {
		t.Fatalf("allow list: %v", err)
	}
	for _, v6 := range []string{"2001:db8::/32", "[2001:db8::1]:443", "2001:db8::1"} {
		if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", v6}}); !isInvalid(err) || !strings.Contains(err.Error(), "IPv6") {
			t.Errorf("an IPv6 entry %s = %v, want Invalid: it would allow nothing", v6, err)
		}
	}
	err = p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", "not a domain"}})
	if !isInvalid(err) || !strings.Contains(err.Error(), `"not a domain"`) {
		t.Fatalf("bad entry = %v, want Invalid naming it", err)
	}
	long := make([]string, egress.MaxEntries+1)
	for i := range long {
		long[i] = "example.com"
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: long}); !isInvalid(err) {
		t.Fatalf("%d entries = %v, want Invalid", len(long), err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: long[:egress.MaxEntries]}); err != nil {
		t.Fatalf("%d entries: %v", egress.MaxEntries, err)
	}
	// The list is in force inside: a name outside it does not resolve.
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "getent", Args: []string{"hosts", "denied.example"}}, sandbox.ExecOptions{})
	if err != nil || res.ExitCode == 0 {
		t.Errorf("a name outside the list resolved: %+v %v", res, err)
	}
	if _, err := p.Create(ctx, "bad", sandbox.CreateOptions{Network: "bridge"}); !isInvalid(err) {
		t.Fatalf("network bridge = %v, want Invalid", err)
	}
	off, err := p.Create(ctx, "off", sandbox.CreateOptions{Network: sandbox.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ApplyNetworkPolicy(ctx, off, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("deny-all on network none: %v", err)
	}
	if err := p.ApplyNetworkPolicy(ctx, off, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}}); err == nil || !strings.Contains(err.Error(), "egress_allowlist") {
		t.Fatalf("allow list on network none = %v, want a refusal naming egress_allowlist", err)
	}
}

func isInvalid(err error) bool {
	var ie *sandbox.InvalidError
	return errors.As(err, &ie)
}

// On the jail: public_url is advertised; a sandbox made with Publish has
// PublicURL http://127.0.0.1:PORT, through which the application served
// inside is reached; one without is Invalid{no_published_port}.
func TestJailPublicURL(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	if !p.Capabilities().Has(sandbox.CapPublicURL) {
		t.Fatal("public_url not advertised on the jail")
	}
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve inside the sandbox")
	h, err := p.Create(ctx, "web", sandbox.CreateOptions{Publish: []int{8080}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "index.html", []byte("hello from inside\n"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "/usr/bin/python3", Args: []string{"-m", "http.server", "8080", "--bind", "127.0.0.1"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Stop()
	defer p.TerminateSession(context.Background(), h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force})
	u, err := p.PublicURL(ctx, h)
	if err != nil || !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Fatalf("PublicURL = %q, %v; want http://127.0.0.1:PORT", u, err)
	}
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(u + "/index.html")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode == 200 {
			break
		}
	}
	if body != "hello from inside\n" {
		t.Fatalf("GET %s = %q", u, body)
	}
	plain, err := p.Create(ctx, "plain", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.PublicURL(ctx, plain); !isInvalid(err) {
		t.Errorf("PublicURL of a sandbox that publishes nothing = %v, want Invalid", err)
	}
	if _, err := p.Create(ctx, "bad", sandbox.CreateOptions{Publish: []int{70000}}); !isInvalid(err) {
		t.Errorf("publish 70000 = %v, want Invalid", err)
	}
}
