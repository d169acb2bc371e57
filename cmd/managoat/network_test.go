package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/sandbox"
)

func TestNetworkFlags(t *testing.T) {
	parse := func(args ...string) *networkFlags {
		var nf networkFlags
		fs := flag.NewFlagSet("create", flag.ContinueOnError)
		nf.add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &nf
	}
	n, ports, err := parse("--network", "none", "--publish", "8080", "--publish", "9000").options("local")
	if err != nil || n != sandbox.NetworkNone || !slices.Equal(ports, []int{8080, 9000}) {
		t.Fatalf("options = %q %v %v", n, ports, err)
	}
	for _, args := range [][]string{{"--network", "bridge"}, {"--publish", "0"}, {"--publish", "http"}, {"--publish", "70000"}} {
		if _, _, err := parse(args...).options("local"); !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	var ie *sandbox.InvalidError
	if _, _, err := parse("--publish", "8080").options("e2b"); !errors.As(err, &ie) {
		t.Errorf("--publish on e2b = %v, want Invalid", err)
	}
	if n, ports, err := parse().options("e2b"); err != nil || n != "" || ports != nil {
		t.Errorf("no flags on e2b = %q %v %v", n, ports, err)
	}
	// Through the platform, serve proxies published ports (or refuses them).
	for _, p := range []string{"platform", "platform:local"} {
		if _, ports, err := parse("--publish", "8080").options(p); err != nil || len(ports) != 1 || ports[0] != 8080 {
			t.Errorf("--publish on %s = %v %v", p, ports, err)
		}
		if _, _, err := parse("--network", "none").options(p); !errors.As(err, &ie) {
			t.Errorf("--network on %s = %v, want Invalid", p, err)
		}
	}
}

// TestPolicyFlags: --allow takes domains, CIDRs and addresses
// (comma-separated, repeatable), --allow "" and --deny all deny all, no
// flag is no policy; a bad entry, a --deny other than all, and --deny all
// with --allow are refused before anything is made.
func TestPolicyFlags(t *testing.T) {
	parse := func(args ...string) (sandbox.NetworkPolicy, bool, error) {
		var pf policyFlags
		fs := flag.NewFlagSet("create", flag.ContinueOnError)
		pf.add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return pf.policy(fs)
	}
	if _, ok, err := parse(); ok || err != nil {
		t.Errorf("no flag = %v %v, want no policy", ok, err)
	}
	if pol, ok, err := parse("--allow", "api.example.com, *.example.org", "--allow", "10.0.0.0/8:443"); !ok || err != nil || !slices.Equal(pol.Allow, []string{"api.example.com", "*.example.org", "10.0.0.0/8:443"}) {
		t.Errorf("--allow = %v %v %v", pol, ok, err)
	}
	for _, args := range [][]string{{"--allow", ""}, {"--deny", "all"}} {
		if pol, ok, err := parse(args...); !ok || err != nil || pol.Allow == nil || len(pol.Allow) != 0 {
			t.Errorf("%v = %v %v %v, want deny all", args, pol, ok, err)
		}
	}
	if _, _, err := parse("--allow", "https://github.com"); err == nil {
		t.Errorf("a URL accepted")
	}
	for _, args := range [][]string{{"--deny", "github.com"}, {"--deny", "all", "--allow", "github.com"}} {
		if _, _, err := parse(args...); !errors.As(err, new(usageError)) {
			t.Errorf("%v = %v, want a usage error", args, err)
		}
	}
}

// TestPolicyThroughTheBinary: create --allow with a CIDR, a domain and a
// wildcard puts the list in force (policy NAME prints it, ls -o wide
// shows it); policy --allow takes a CIDR (fails on the old code: "is not
// a domain"); a denied lookup inside fails at once, and policy NAME then
// shows it as refused by the sandbox's policy; create --deny all denies
// all; run --deny all runs its command under it; a bad entry makes no
// sandbox. The denied names are refused by the sandbox's own resolver:
// nothing leaves the host.
func TestPolicyThroughTheBinary(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--allow", "10.0.0.0/8,allowed.example", "--allow", "*.allowed.example:443", "polbox"); code != 0 {
		t.Fatalf("create --allow: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "polbox") })
	if out, e, code := managoatEnv(t, env, "policy", "polbox"); code != 0 || !strings.Contains(out, "allow: 10.0.0.0/8, allowed.example, *.allowed.example:443") {
		t.Errorf("policy polbox = %d %q %s", code, out, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls", "-o", "wide"); !strings.Contains(out, "10.0.0.0/8,allowed.example,*.allowed.example:443") {
		t.Errorf("ls -o wide does not show the allow list: %q", out)
	}
	if _, e, code := managoatEnv(t, env, "policy", "polbox", "--allow", "192.0.2.0/24:443,allowed.example"); code != 0 {
		t.Fatalf("policy --allow with a CIDR: %d %s", code, e)
	}
	if out, e, code := managoatEnv(t, env, "exec", "polbox", "--", "getent", "hosts", "denied.example"); code == 0 {
		t.Errorf("a denied name resolved inside: %q %s", out, e)
	}
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, _, _ = managoatEnv(t, env, "policy", "polbox"); strings.Contains(out, "refused lookup denied.example") {
			break
		}
	}
	if !strings.Contains(out, "allow: 192.0.2.0/24:443, allowed.example") || !strings.Contains(out, "refused lately:") ||
		!strings.Contains(out, "refused lookup denied.example: no entry allows the name") {
		t.Errorf("policy polbox after a denied lookup = %q", out)
	}
	// A refused name is the sandbox's to choose, bytes and all (a DNS label
	// may hold any byte): one carrying a terminal escape is shown escaped.
	const rawQuery = `import socket,struct
ns=[l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
q=struct.pack('>HHHHHH',0x1234,0x0100,1,0,0,0)
for l in [b'\x1b]0;pwned\x07\x1b[2Jevil',b'example']: q+=bytes([len(l)])+l
q+=b'\x00'+struct.pack('>HH',1,1)
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q,(ns,53)); s.recv(512)`
	if _, e, code := managoatEnv(t, env, "exec", "polbox", "--", "python3", "-c", rawQuery); code != 0 {
		t.Fatalf("a raw DNS query from the sandbox: %d %s", code, e)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, _, _ = managoatEnv(t, env, "policy", "polbox"); strings.Contains(out, "evil") {
			break
		}
	}
	if !strings.Contains(out, "evil") || strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("policy polbox after a lookup of a name with escapes: %q, want it listed with its controls escaped", out)
	}
	if _, e, code := managoatEnv(t, env, "create", "--deny", "all", "denybox"); code != 0 {
		t.Fatalf("create --deny all: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "denybox") })
	if out, _, _ := managoatEnv(t, env, "policy", "denybox"); !strings.Contains(out, "allow: nothing") {
		t.Errorf("policy denybox = %q", out)
	}
	if out, e, code := managoatEnv(t, env, "run", "--deny", "all", "--", "getent", "hosts", "allowed.example"); code == 0 {
		t.Errorf("run --deny all resolved a name: %q %s", out, e)
	}
	if _, e, code := managoatEnv(t, env, "create", "--allow", "https://allowed.example", "badbox"); code == 0 || !strings.Contains(e, "neither a domain") {
		t.Errorf("create --allow with a URL = %d %s", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls"); strings.Contains(out, "badbox") || strings.Contains(out, "run-") {
		t.Errorf("a sandbox left behind: %q", out)
	}
}

// TestServedPortOnlyThroughItsProxy: a port published through serve is
// reached with the account's key through serve's proxy, and by serve's
// own user (root here) at the local CLI's url; another local user (uid
// 65534) gets nothing at either of the published port's host
// endpoints, the unix socket serve proxies (refused at connect) and the
// loopback TCP port (reset), nor without a key through serve. (Fails on
// the old code: the TCP port answered uid 65534, as the issue
// reproduced with su nobody -c curl.)
func TestServedPortOnlyThroughItsProxy(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "/usr/bin/python3 (Debian package python3) to serve inside the sandbox and to play the other user")
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_RUNNERS_ENABLED=false"}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "alice"); code != 0 {
		t.Fatalf("account create: %d %s", code, e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "alice")
	if code != 0 {
		t.Fatalf("key create: %d %s", code, e)
	}
	key = strings.TrimSpace(key)
	startServe(t, base, addr)
	alice := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
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
	page := fmt.Sprintf("secret page %d\n", time.Now().UnixNano())
	if _, e, code := managoatEnv(t, alice, "exec", "web", "--", "sh", "-c", "printf '"+strings.TrimSpace(page)+"\\n' > index.html"); code != 0 {
		t.Fatalf("write the page: %d %s", code, e)
	}
	if _, e, code := managoatEnv(t, alice, "spawn", "--detach", "web", "--", "/usr/bin/python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"); code != 0 {
		t.Fatalf("spawn the application: %d %s", code, e)
	}
	get := func(u, key string) (int, string) {
		req, _ := http.NewRequest("GET", u, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	proxied := "http://" + addr + "/v1/sandboxes/web/ports/8080/index.html"
	var code200 int
	var body string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code200, body = get(proxied, key); code200 == 200 {
			break
		}
	}
	if code200 != 200 || body != page {
		t.Fatalf("through serve's proxy with the key = %d %q", code200, body)
	}
	if c, _ := get(proxied, ""); c != 401 {
		t.Errorf("through serve's proxy without a key = %d, want 401", c)
	}
	// The published port's host endpoints: its unix socket in this
	// user's PortsDir (named by its loopback TCP port), the one whose
	// application answers this test's page.
	dir, err := egress.PortsDir()
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var sock, hostPort string
	for _, ent := range ents {
		path := filepath.Join(dir, ent.Name())
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		resp, err := hc.Get("http://localhost/index.html")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		hc.CloseIdleConnections()
		if string(b) == page {
			sock, hostPort = path, "127.0.0.1:"+ent.Name()
		}
	}
	if sock == "" {
		t.Fatalf("no socket in %s answers the page", dir)
	}
	// serve's own user (root here) at the loopback TCP port, as the
	// local CLI's url gives it.
	if c, b := get("http://"+hostPort+"/index.html", ""); c != 200 || b != page {
		t.Errorf("the owner at %s = %d %q", hostPort, c, b)
	}
	for _, target := range []string{"unix " + sock, "tcp " + hostPort} {
		if got := otherUserGet(t, target); got != "refused" {
			t.Errorf("BREACHED: uid 65534 through %s: %s", target, got)
		}
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
