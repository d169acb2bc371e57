package main

import (
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// npmRegistry is the npm registry this host is configured for (npm config
// get registry), and its host name: never written down here.
func npmRegistry(t *testing.T) (reg, host string) {
	t.Helper()
	_, nodeErr := exec.LookPath("node")
	npm, npmErr := exec.LookPath("npm")
	testenv.Require(t, nodeErr == nil && npmErr == nil, "node and npm (Debian's nodejs and npm) install a real package in the sandbox")
	out, err := exec.Command(npm, "config", "get", "registry").Output()
	u, perr := url.Parse(strings.TrimSpace(string(out)))
	if err != nil || perr != nil || u.Hostname() == "" {
		t.Fatalf("npm config get registry: %v %v %q", err, perr, out)
	}
	return u.String(), u.Hostname()
}

// TestTrustHostCAInstallsARealPackage: in a sandbox made with
// --trust-host-ca whose egress allow list names only the host's npm
// registry, npm installs a real package from that registry (through
// whatever CA the host trusts, a TLS-inspecting proxy's included) and node
// runs it; a request to any other host is refused. --trust-host-ca is
// refused by a provider whose sandboxes are not on this host.
func TestTrustHostCAInstallsARealPackage(t *testing.T) {
	testenv.RequireRoot(t)
	reg, host := npmRegistry(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--trust-host-ca", "npmbox"); code != 0 {
		t.Fatalf("create --trust-host-ca: exit %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "npmbox") })
	if _, e, code := managoatEnv(t, env, "policy", "npmbox", "--allow", host); code != 0 {
		t.Fatalf("policy --allow the registry's host: exit %d %s", code, e)
	}
	out, e, code := managoatEnv(t, env, "exec", "--timeout", "3m", "npmbox", "--", "sh", "-c",
		`npm config set registry "$0" && npm init -y >/dev/null && npm install --no-audit --no-fund is-number@7.0.0 >/dev/null && node -e 'console.log(require("is-number")(5), require("is-number/package.json").version)'`, reg)
	if code != 0 || out != "true 7.0.0\n" {
		t.Fatalf("npm install from %s's registry in the sandbox: exit %d stdout %q stderr %q", "the host", code, out, e)
	}
	// Another host: refused by the sandbox's policy, by node and by curl
	// (no request leaves the sandbox's network).
	out, e, code = managoatEnv(t, env, "exec", "--timeout", "1m", "npmbox", "--", "node", "-e",
		`fetch("https://example.org/").then(r => console.log("reached", r.status), e => console.log("refused", (e.cause && e.cause.code) || e.message))`)
	if code != 0 || !strings.HasPrefix(out, "refused ") {
		t.Errorf("a request to another host: exit %d stdout %q stderr %q, want it refused", code, out, e)
	}
	if _, e, code := managoatEnv(t, env, "--provider", "fake", "run", "--trust-host-ca", "--", "emit"); code != exitCouldNotRun || !strings.Contains(e, "(invalid trust_host_ca)") {
		t.Errorf("--trust-host-ca on the fake: exit %d %s", code, e)
	}
}
