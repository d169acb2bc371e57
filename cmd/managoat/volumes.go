package main

import (
	"flag"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// volumeFlags collects -v/--volume HOST:SANDBOX[:ro|:rw], as docker run
// takes them: HOST is a host file or directory (relative to the current
// directory), SANDBOX the absolute path it is bound at. Only the local
// provider binds host paths; the others refuse (not_supported), through
// sandbox.CheckNoMounts, never drop them.
type volumeFlags struct{ specs multiFlag }

func (f *volumeFlags) add(fs *flag.FlagSet) {
	fs.Var(&f.specs, "v", "bind `HOST:SANDBOX[:ro]`: the host file or directory HOST (relative to the current directory) at the absolute path SANDBOX, read-only with :ro (repeatable; local provider)")
	fs.Var(&f.specs, "volume", "the same as -v")
}

// mounts is the flags' mounts, or a usage error naming the bad one.
func (f *volumeFlags) mounts() ([]sandbox.Mount, error) {
	var out []sandbox.Mount
	for _, s := range f.specs {
		m, err := parseVolume(s)
		if err != nil {
			return nil, usageError{msg: fmt.Sprintf("-v %q: %v", s, err)}
		}
		out = append(out, m)
	}
	return out, nil
}

// parseVolume reads HOST:SANDBOX[:ro|:rw].
func parseVolume(s string) (sandbox.Mount, error) {
	parts := strings.Split(s, ":")
	var m sandbox.Mount
	switch len(parts) {
	case 2:
	case 3:
		switch parts[2] {
		case "ro":
			m.ReadOnly = true
		case "rw":
		default:
			return m, fmt.Errorf("mode %q is not ro or rw", parts[2])
		}
	default:
		return m, fmt.Errorf("want HOST:SANDBOX or HOST:SANDBOX:ro (a path with ':' cannot be given)")
	}
	host, target := parts[0], parts[1]
	if host == "" {
		return m, fmt.Errorf("empty HOST path")
	}
	if target == "" || !path.IsAbs(target) {
		return m, fmt.Errorf("SANDBOX path %q is not absolute", target)
	}
	abs, err := filepath.Abs(host)
	if err != nil {
		return m, err
	}
	m.Source, m.Target = abs, path.Clean(target)
	return m, nil
}
