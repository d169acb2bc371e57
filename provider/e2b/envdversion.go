package e2b

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// envd versions that changed what a client may rely on, from E2B's own SDK
// (packages/js-sdk/src/envd/versions.ts of e2b-dev/E2B).
const (
	// EnvdStdinVersion is the first envd that honours Start's stdin field;
	// an older one gives every process an open stdin.
	EnvdStdinVersion = "0.3.0"
	// EnvdCloseStdinVersion is the first envd with CloseStdin.
	EnvdCloseStdinVersion = "0.5.2"
)

// versionLess reports whether envd version a is older than b. An empty or
// unparsable version is taken as the oldest: the safe side is the
// workaround, which also works on a new envd.
func versionLess(a, b string) bool {
	pa, oka := parseVersion(a)
	pb, _ := parseVersion(b)
	if !oka {
		return true
	}
	for i := range pa {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return false
}

func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	v, _, _ = strings.Cut(v, "-")
	parts := strings.Split(v, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return out, false
	}
	for i, s := range parts {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

// rememberVersion records sandbox id's envd version from an answer that
// names it (create, connect, the listing).
func (p *Provider) rememberVersion(id, version string) {
	if version != "" {
		p.versions.Store(id, version)
	}
}

// envdVersion is sandbox id's envd version as last seen, or "" when none
// was.
func (p *Provider) envdVersion(id string) string {
	if v, ok := p.versions.Load(id); ok {
		return v.(string)
	}
	return ""
}

// noStdin makes a process config run with stdin closed on an envd that
// ignores Start's stdin field: the command is exec'ed by sh with stdin
// from /dev/null, so argv, environment and exit status are its own.
func noStdin(pc processConfig) processConfig {
	pc.Args = append([]string{"-c", `exec "$@" </dev/null`, "sh", pc.Cmd}, pc.Args...)
	pc.Cmd = "/bin/sh"
	return pc
}

// errNoCloseStdin is CloseStdin's answer on an envd too old to have it:
// the EOF cannot be delivered, and saying nothing would leave a command
// that waits for it waiting forever.
func errNoCloseStdin(version string) error {
	if version == "" {
		version = "of unknown version"
	}
	return fmt.Errorf("e2b: envd %s has no CloseStdin (it needs %s; rebuild the template): %w",
		version, EnvdCloseStdinVersion, sandbox.ErrNotSupported)
}
