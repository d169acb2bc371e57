package main

import (
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
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
	if pol, ok, err := parse("--allow", "github.com, *.pypi.org", "--allow", "10.0.0.0/8:443"); !ok || err != nil || !slices.Equal(pol.Allow, []string{"github.com", "*.pypi.org", "10.0.0.0/8:443"}) {
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
