package main

import (
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// TestDenyEntries: --deny takes domains and CIDRs as well as all, and
// takes them out of the --allow list (the policy is an allow list); what
// an allow list cannot say is a usage error: --deny ENTRY without
// --allow, and an exception inside a broader allow entry.
func TestDenyEntries(t *testing.T) {
	parse := func(args ...string) ([]string, error) {
		var pf policyFlags
		fs := flag.NewFlagSet("create", flag.ContinueOnError)
		pf.add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		pol, ok, err := pf.policy(fs)
		if err == nil && !ok {
			t.Fatalf("%v: no policy", args)
		}
		return pol.Allow, err
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--allow", "a.example,b.example", "--deny", "b.example"}, []string{"a.example"}},
		{[]string{"--allow", "a.example,B.Example.", "--deny", "b.example"}, []string{"a.example"}},
		{[]string{"--allow", "x.a.example,y.b.example", "--deny", "*.a.example"}, []string{"y.b.example"}},
		{[]string{"--allow", "*.x.a.example,b.example", "--deny", "*.a.example"}, []string{"b.example"}},
		{[]string{"--allow", "a.example", "--deny", "*.a.example"}, []string{"a.example"}}, // a wildcard is strict subdomains
		{[]string{"--allow", "10.1.0.0/16,10.2.3.4,192.168.0.0/24", "--deny", "10.0.0.0/8"}, []string{"192.168.0.0/24"}},
		{[]string{"--allow", "a.example:443,a.example:22", "--deny", "a.example:22"}, []string{"a.example:443"}},
		{[]string{"--allow", "a.example:443", "--deny", "a.example"}, []string{}},
		{[]string{"--allow", "a.example", "--deny", "c.example,10.0.0.0/8"}, []string{"a.example"}}, // denied already
		{[]string{"--allow", "[2001:db8::1]:443", "--deny", "2001:db8::/32"}, []string{}},
		{[]string{"--allow", "a.example", "--deny", "a.example"}, []string{}},
		{[]string{"--deny", "all"}, []string{}},
	} {
		got, err := parse(tc.args...)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v = %q, %v; want %q", tc.args, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--deny", "a.example"}, "without --allow"},
		{[]string{"--allow", "*.a.example", "--deny", "x.a.example"}, "inside --allow *.a.example"},
		{[]string{"--allow", "*.a.example", "--deny", "*.x.a.example"}, "inside"},
		{[]string{"--allow", "10.0.0.0/8", "--deny", "10.1.0.0/16"}, "inside"},
		{[]string{"--allow", "10.0.0.0/8", "--deny", "10.1.2.3"}, "inside"},
		{[]string{"--allow", "a.example", "--deny", "a.example:22"}, "inside"},
		{[]string{"--allow", "*.a.example:443", "--deny", "x.a.example"}, "inside"},
		{[]string{"--deny", "all", "--deny", "a.example"}, "no other --deny"},
		{[]string{"--deny", "all", "--allow", "a.example"}, "no --allow"},
	} {
		_, err := parse(tc.args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v = %v, want a usage error about %q", tc.args, err, tc.want)
		}
	}
	if _, err := parse("--allow", "a.example", "--deny", "https://a.example"); err == nil || !strings.Contains(err.Error(), "neither a domain") {
		t.Errorf("a URL in --deny = %v", err)
	}
}

// TestDenyThroughTheBinary: create and run take --deny entries out of
// --allow, policy NAME shows the result, and policy NAME --deny does the
// same on a sandbox; a deny the allow list cannot express makes no
// sandbox.
func TestDenyThroughTheBinary(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--allow", "a.example,b.example,10.0.0.0/8", "--deny", "b.example", "--deny", "10.0.0.0/8", "denybox"); code != 0 {
		t.Fatalf("create --allow --deny: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "denybox") })
	if out, _, _ := managoatEnv(t, env, "policy", "denybox"); !strings.Contains(out, "allow: a.example\n") {
		t.Errorf("policy denybox = %q, want allow: a.example", out)
	}
	if _, e, code := managoatEnv(t, env, "policy", "denybox", "--allow", "a.example,c.example", "--deny", "a.example"); code != 0 {
		t.Fatalf("policy --allow --deny: %d %s", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "policy", "denybox"); !strings.Contains(out, "allow: c.example\n") {
		t.Errorf("policy denybox after policy --deny = %q, want allow: c.example", out)
	}
	if out, e, code := managoatEnv(t, env, "run", "--allow", "a.example", "--deny", "a.example", "--", "getent", "hosts", "a.example"); code == 0 {
		t.Errorf("run --allow a.example --deny a.example resolved it: %q %s", out, e)
	}
	_, e, code := managoatEnv(t, env, "create", "--allow", "*.a.example", "--deny", "x.a.example", "badbox")
	if code != exitUsage || !strings.Contains(e, "cannot make an exception") {
		t.Errorf("create with an exception inside an allow entry: exit %d %s", code, e)
	}
	_, e, code = managoatEnv(t, env, "run", "--deny", "a.example", "--", "true")
	if code != exitUsage || !strings.Contains(e, "allow list") {
		t.Errorf("run --deny without --allow: exit %d %s", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls", "-q"); strings.TrimSpace(out) != "denybox" {
		t.Errorf("ls -q = %q: a refused create or run left a sandbox", out)
	}
}
