package main

import (
	"archive/tar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image/imagetest"
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
	if _, e, code := managoatEnv(t, env, "create", "--trust-host-ca", "--allow", host, "npmbox"); code != 0 {
		t.Fatalf("create --trust-host-ca --allow the registry's host: exit %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "npmbox") })
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

// aptArchive is the Debian archive this host's apt is configured for (the
// first URIs of a deb822 .sources file, or of a deb line), read from its
// configuration, and its host name; a configuration that carries
// credentials (auth.conf, a user in the URI) skips the test: it would have
// to copy them into the sandbox.
func aptArchive(t *testing.T) (uri, host string) {
	t.Helper()
	_, aptErr := exec.LookPath("apt-get")
	_, debErr := exec.LookPath("dpkg-deb")
	testenv.Require(t, aptErr == nil && debErr == nil, "apt-get and dpkg-deb (a Debian host) fetch and unpack a real package in the sandbox")
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, "/etc/apt/sources.list")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			var raw string
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				raw = fields[1]
			case len(fields) >= 3 && fields[0] == "deb" && !strings.HasPrefix(fields[1], "["):
				raw = fields[1]
			}
			u, err := url.Parse(raw)
			if raw == "" || err != nil || u.Hostname() == "" || !strings.Contains(string(b), "bookworm") {
				continue
			}
			if u.User != nil {
				t.Skip("this host's apt archive URI carries credentials: the sandbox would need a copy of them")
			}
			if auth, _ := filepath.Glob("/etc/apt/auth.conf.d/*"); len(auth) > 0 {
				t.Skip("this host's apt reaches its archive with credentials (auth.conf.d): the sandbox would need a copy of them")
			}
			if _, err := os.Stat("/etc/apt/auth.conf"); err == nil {
				t.Skip("this host's apt reaches its archive with credentials (auth.conf): the sandbox would need a copy of them")
			}
			return u.String(), u.Hostname()
		}
	}
	testenv.Require(t, false, "an apt archive for bookworm in this host's apt configuration")
	return "", ""
}

// TestAptGetFromDebiansArchive: in a sandbox whose egress allow list names
// only the host's Debian archive, apt-get (as the sandbox's user, with its
// own lists and cache in the home: no root, no credentials) updates from
// that archive, downloads a real package, and the unpacked program runs; a
// request to another host is refused.
func TestAptGetFromDebiansArchive(t *testing.T) {
	testenv.RequireRoot(t)
	uri, host := aptArchive(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--trust-host-ca", "aptbox"); code != 0 {
		t.Fatalf("create: exit %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "aptbox") })
	// Here the list is set after create, with policy (the npm test sets
	// it at create, with --allow).
	if _, e, code := managoatEnv(t, env, "policy", "aptbox", "--allow", host); code != 0 {
		t.Fatalf("policy --allow the archive's host: exit %d %s", code, e)
	}
	out, e, code := managoatEnv(t, env, "exec", "--timeout", "5m", "aptbox", "--", "sh", "-c", `set -e
mkdir -p apt/state/lists/partial apt/cache/archives/partial
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $0 bookworm main" > apt/sources.list
O="-o Dir::Etc::SourceList=$HOME/apt/sources.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State=$HOME/apt/state -o Dir::Cache=$HOME/apt/cache -o Dir::State::status=/var/lib/dpkg/status -o Debug::NoLocking=1 -o Acquire::Languages=none"
apt-get $O -qq update 2>/dev/null
apt-get $O -qq download hello 2>/dev/null
dpkg-deb -x hello_*.deb root
./root/usr/bin/hello`, uri)
	if code != 0 || out != "Hello, world!\n" {
		t.Fatalf("apt-get update and download hello from the host's archive in the sandbox: exit %d stdout %q stderr %q", code, out, e)
	}
	out, e, code = managoatEnv(t, env, "exec", "--timeout", "1m", "aptbox", "--", "sh", "-c", "curl -sS -m 20 http://example.org/ >/dev/null 2>&1; echo $?")
	if code != 0 || out == "0\n" {
		t.Errorf("a request to another host: exit %d stdout %q stderr %q, want it refused", code, out, e)
	}
}

// TestTrustHostCAOnAnImage: on an image, whose /etc/ssl is its own,
// --trust-host-ca binds the host's bundle read-only where the variables
// say (the image's own bundle, or none, underneath); without the flag the
// image's own is what the sandbox reads.
func TestTrustHostCAOnAnImage(t *testing.T) {
	testenv.RequireRoot(t)
	bundle, err := hostCABundle()
	testenv.Require(t, err == nil, "a CA bundle on this host")
	want, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.Serve(t)
	withOwn := reg.Push(t, "ca:own", v1.Config{}, append(imagetest.Conformance(t), imagetest.Layer{{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/ssl/", Type: tar.TypeDir}, {Name: "etc/ssl/certs/", Type: tar.TypeDir}, {Name: "etc/ssl/certs/ca-certificates.crt", Body: "the image's own\n"}})...)
	without := reg.Push(t, "ca:none", v1.Config{}, imagetest.Conformance(t)...)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, env, "run", "--image", withOwn, "--", "cat", "/etc/ssl/certs/ca-certificates.crt"); code != 0 || out != "the image's own\n" {
		t.Fatalf("run on the image without --trust-host-ca: exit %d %q %s", code, out, e)
	}
	for _, ref := range []string{withOwn, without} {
		out, e, code := managoatEnv(t, env, "run", "--image", ref, "--trust-host-ca", "--", "sh", "-c", `cat "$SSL_CERT_FILE"; echo "$NODE_EXTRA_CA_CERTS" >&2; echo x > "$SSL_CERT_FILE"`)
		if code == 0 || out != string(want) || !strings.Contains(e, "/etc/ssl/certs/ca-certificates.crt\n") {
			t.Errorf("run --image %s --trust-host-ca: exit %d, %d bytes read (want the host's %d and the write refused), stderr %q", ref, code, len(out), len(want), e)
		}
	}
	if got, err := os.ReadFile(bundle); err != nil || string(got) != string(want) {
		t.Errorf("the host's bundle changed: %v", err)
	}
}
