package mechanism

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Mount is a host file or directory bound into a sandbox (Spec.Mounts):
// docker's -v HOST:SANDBOX[:ro]. The sandbox sees the source's own files
// (a symbolic link inside it stays a link, resolved inside the sandbox),
// nosuid and nodev, read-only when ReadOnly.
type Mount struct {
	// Source is the host path, absolute and clean. Provision resolves
	// its symbolic links once (ResolveMounts) and keeps the result; every
	// start opens that path refusing any symbolic link on the way, so a
	// link swapped in later cannot redirect the mount.
	Source string
	// Target is where the sandbox sees it: absolute, clean, and not a
	// path the mechanism builds itself (see Spec.Validate).
	Target string
	// ReadOnly makes the mount read-only (EROFS to every write), in
	// force before the workload starts and checked after the mount.
	ReadOnly bool `json:",omitempty"`
}

// String is docker's notation, SOURCE:TARGET[:ro].
func (m Mount) String() string {
	s := m.Source + ":" + m.Target
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// MaxMounts is the most mounts a Spec may have.
const MaxMounts = 32

// reservedTargets are the paths a mechanism builds itself: a mount may not
// be on one of them nor on one of their ancestors (the root included);
// a target beneath the first group (the kernel's and the devices' trees)
// is refused too. Beneath Home and /tmp is allowed.
var (
	reservedTrees = []string{"/proc", "/dev", "/sys"}
	reservedPaths = []string{Home, "/tmp", "/etc"}
)

// validateMounts checks the syntax of ms (Spec.Validate): it touches no
// file.
func validateMounts(ms []Mount) error {
	if len(ms) > MaxMounts {
		return Invalid("Mounts", fmt.Sprintf("%d mounts: at most %d", len(ms), MaxMounts))
	}
	for i, m := range ms {
		switch {
		case m.Source == "" || !filepath.IsAbs(m.Source):
			return Invalid("Mounts", fmt.Sprintf("source %q is not an absolute path", m.Source))
		case filepath.Clean(m.Source) != m.Source:
			return Invalid("Mounts", fmt.Sprintf("source %q is not clean (%q)", m.Source, filepath.Clean(m.Source)))
		case strings.ContainsRune(m.Source, 0) || strings.ContainsRune(m.Target, 0):
			return Invalid("Mounts", "a path has a NUL byte")
		case m.Target == "" || !path.IsAbs(m.Target):
			return Invalid("Mounts", fmt.Sprintf("target %q is not an absolute path", m.Target))
		case path.Clean(m.Target) != m.Target:
			return Invalid("Mounts", fmt.Sprintf("target %q is not clean (%q)", m.Target, path.Clean(m.Target)))
		case m.Target == "/":
			return Invalid("Mounts", "target / is the sandbox's root")
		}
		for _, r := range reservedTrees {
			if m.Target == r || strings.HasPrefix(m.Target, r+"/") {
				return Invalid("Mounts", fmt.Sprintf("target %s is in %s, which the mechanism builds", m.Target, r))
			}
		}
		for _, r := range reservedPaths {
			if m.Target == r || strings.HasPrefix(r, m.Target+"/") {
				return Invalid("Mounts", fmt.Sprintf("target %s would cover %s, which the mechanism builds (mount beneath it instead)", m.Target, r))
			}
		}
		for _, o := range ms[:i] {
			switch {
			case o.Target == m.Target:
				return Invalid("Mounts", fmt.Sprintf("target %s twice", m.Target))
			case strings.HasPrefix(m.Target, o.Target+"/"), strings.HasPrefix(o.Target, m.Target+"/"):
				// The inner one's mount point would be made in the
				// outer one's source: a host directory.
				return Invalid("Mounts", fmt.Sprintf("targets %s and %s are nested", o.Target, m.Target))
			}
		}
	}
	return nil
}

// ResolveMounts returns ms with each source's symbolic links resolved on
// the host, after checking that it exists and is a directory or a
// regular file. Mechanisms call it at Provision and keep the result:
// the path is resolved once, when the sandbox is made. A missing source
// or one of another kind is an *InvalidError naming it.
func ResolveMounts(ms []Mount) ([]Mount, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	out := make([]Mount, len(ms))
	for i, m := range ms {
		src, err := filepath.EvalSymlinks(m.Source)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, Invalid("Mounts", fmt.Sprintf("source %s does not exist", m.Source))
		} else if err != nil {
			return nil, Invalid("Mounts", fmt.Sprintf("source %s: %v", m.Source, err))
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, Invalid("Mounts", fmt.Sprintf("source %s: %v", m.Source, err))
		}
		if !st.IsDir() && !st.Mode().IsRegular() {
			return nil, Invalid("Mounts", fmt.Sprintf("source %s is neither a directory nor a regular file (%s)", m.Source, st.Mode().Type()))
		}
		m.Source = src
		out[i] = m
	}
	return out, nil
}

// mountCapabilities returns HostMounts when spec has mounts (part of
// LimitCapabilities).
func mountCapabilities(spec Spec) []Capability {
	if len(spec.Mounts) > 0 {
		return []Capability{HostMounts}
	}
	return nil
}
