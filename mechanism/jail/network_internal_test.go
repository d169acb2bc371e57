package jail

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// TestEgressAdoptedByANewManager: when the process serving a sandbox's
// egress is gone, the sandbox's connections are refused (it fails
// closed); a Start from another process (a new supervisor adopting the
// sandbox) serves it again, under the policy that was in force.
func TestEgressAdoptedByANewManager(t *testing.T) {
	testenv.RequireRoot(t)
	adoptedByANewManager(t, egresstest.New(t))
}

// TestRootlessEgressAdoptedByANewManager: the same for a rootless jail
// (as uid 65534): the new manager's proxy is set up by mechanism/egress's
// helper in the running sandbox's namespaces.
func TestRootlessEgressAdoptedByANewManager(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	adoptedByANewManager(t, in)
}

func adoptedByANewManager(t *testing.T, in *egresstest.Internet) {
	_, err := os.Stat("/usr/bin/curl")
	testenv.Require(t, err == nil, "needs /usr/bin/curl (Debian package curl)")
	dir := t.TempDir()
	cfg := Config{StateDir: dir, Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := first.Provision(ctx, "a", mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	defer first.Destroy(context.Background(), "a")
	if err := first.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := first.UpdateEgress(ctx, "a", []string{egresstest.Allowed}); err != nil {
		t.Fatal(err)
	}
	get := func(j *Jail, url string) string {
		c, err := j.Execute(ctx, "a", []string{"curl", "-sS", "--max-time", "5", url}, mechanism.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.ExitStatus != 0 {
			return "FAILED " + strings.TrimSpace(string(c.Stderr))
		}
		return strings.TrimSpace(string(c.Stdout))
	}
	if got := get(first, "http://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Fatalf("before: %q", got)
	}
	first.stopNetwork("a") // as if the process serving it died
	if got := get(first, "http://"+egresstest.Allowed+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Fatalf("with nobody serving its egress the sandbox still reached out: %q", got)
	}
	second, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	defer second.stopNetwork("a")
	if got := get(second, "http://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("after adoption: %q", got)
	}
	if got := get(second, "http://"+egresstest.Hosts[egresstest.Denied].String()+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED after adoption: the policy in force before was lost: %q", got)
	}
	// A second Start with the proxy served changes nothing.
	if err := second.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
}
