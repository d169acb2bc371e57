package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/managoat/managoat/sandbox"
)

// trustCAFlag is create's and run's --trust-host-ca: the sandbox trusts
// the CA certificates this host trusts (where a TLS-inspecting proxy's CA
// was added to the host's bundle, the sandbox's package managers then
// reach their registries through it), the documented way of each tool:
//
//   - the host's bundle (SSL_CERT_FILE when it names a file, else the
//     first of the distributions' usual paths) is what the sandbox reads:
//     on the jail without --image its /etc/ssl is the host's, bound
//     read-only already; otherwise the bundle is bound read-only over
//     /etc/ssl/certs/ca-certificates.crt (a host mount, with what -v
//     costs: the workload runs as host uid 1000, not in a user namespace
//     of its own);
//   - the variables the tools read name it: SSL_CERT_FILE (OpenSSL, Go,
//     Python's ssl, Ruby), NODE_EXTRA_CA_CERTS and npm_config_cafile
//     (Node, npm, which carry their own CA list otherwise),
//     REQUESTS_CA_BUNDLE and PIP_CERT (requests, pip), CURL_CA_BUNDLE,
//     GIT_SSL_CAINFO, and SSL_CERT_DIR=/etc/ssl/certs.
//
// It exposes to the sandbox the host's CA certificates, which are public
// (a CA's certificate, never its key) and nothing else of the host; a
// sandbox cannot change them (read-only). It is the local provider's: a
// hosted provider's sandboxes do not run on this host.
type trustCAFlag bool

func (f *trustCAFlag) add(fs *flag.FlagSet) {
	fs.BoolVar((*bool)(f), "trust-host-ca", false, "trust this host's CA certificates in the sandbox (its bundle, read-only, and SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, npm_config_cafile, REQUESTS_CA_BUNDLE, PIP_CERT, CURL_CA_BUNDLE, GIT_SSL_CAINFO naming it): for a TLS-inspecting proxy's CA; local provider")
}

// sandboxCABundle is where the sandbox reads the host's bundle.
const sandboxCABundle = "/etc/ssl/certs/ca-certificates.crt"

// hostCABundles are the distributions' bundles, Debian's first.
var hostCABundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",             // openSUSE
	"/etc/ssl/cert.pem",                  // Alpine's link, macOS
}

// hostCABundle is the host's CA bundle: SSL_CERT_FILE when it names a
// regular file, else the first of hostCABundles that is one.
func hostCABundle() (string, error) {
	cands := hostCABundles
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		cands = append([]string{f}, cands...)
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", sandbox.Invalid("trust_host_ca", fmt.Sprintf("--trust-host-ca: this host has no CA bundle (SSL_CERT_FILE, or one of %v)", hostCABundles))
}

// apply adds to a sandbox's options what trusting the host's CAs takes:
// the variables (before env, so that a -e still overrides one) and, where
// the sandbox does not see the host's /etc/ssl as it is, the bundle's
// read-only mount. It refuses for another provider than local.
func (f trustCAFlag) apply(g *globals, image string, env []string, mounts []sandbox.Mount) ([]string, []sandbox.Mount, error) {
	if !f {
		return env, mounts, nil
	}
	if g.provider != "local" {
		return nil, nil, &sandbox.InvalidError{Reason: "trust_host_ca", Msg: fmt.Sprintf("provider %s's sandboxes do not run on this host; --trust-host-ca is the local provider's (give the CA's file with cp and -e SSL_CERT_FILE=... instead)", g.provider)}
	}
	bundle, err := hostCABundle()
	if err != nil {
		return nil, nil, err
	}
	if image != "" || g.mechanism != "jail" && g.mechanism != "trusted" || bundle != sandboxCABundle {
		mounts = append(mounts, sandbox.Mount{Source: bundle, Target: sandboxCABundle, ReadOnly: true})
	}
	at := sandboxCABundle
	if g.mechanism == "trusted" {
		at = bundle // a plain directory on this host: the host's own path
	}
	vars := []string{"SSL_CERT_FILE=" + at, "SSL_CERT_DIR=/etc/ssl/certs", "NODE_EXTRA_CA_CERTS=" + at, "npm_config_cafile=" + at,
		"REQUESTS_CA_BUNDLE=" + at, "PIP_CERT=" + at, "CURL_CA_BUNDLE=" + at, "GIT_SSL_CAINFO=" + at}
	return append(vars, env...), mounts, nil
}
