package local

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// mountsSpec turns CreateOptions.Mounts into the mechanism's, refused
// here, before anything is made, when malformed or when a source is
// missing (Invalid, reason "mounts"). The mechanism resolves each
// source's symbolic links once, at Provision, and keeps the result in its
// state, so every start (a restart, a resume, a new supervisor) mounts
// the same host path; the record keeps them as asked (Get's "mounts",
// and the CLI's check of a create with other options).
func mountsSpec(ms []sandbox.Mount) ([]mechanism.Mount, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	out := make([]mechanism.Mount, len(ms))
	for i, m := range ms {
		out[i] = mechanism.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly}
	}
	err := mechanism.Spec{Mounts: out}.Validate()
	if err == nil {
		_, err = mechanism.ResolveMounts(out)
	}
	var inv *mechanism.InvalidError
	if errors.As(err, &inv) {
		return nil, sandbox.Invalid("mounts", inv.Reason)
	}
	if err != nil {
		return nil, sandbox.Invalid("mounts", err.Error())
	}
	return out, nil
}

// mountsJSON is a sandbox's mounts for Get's raw info.
func mountsJSON(ms []sandbox.Mount) []map[string]any {
	out := make([]map[string]any, len(ms))
	for i, m := range ms {
		out[i] = map[string]any{"source": m.Source, "target": m.Target, "read_only": m.ReadOnly}
	}
	return out
}

// mountAt returns the mount of r whose target is the home-relative path
// rel or one of its ancestors, and the path below the target.
func (r *record) mountAt(rel string) (sandbox.Mount, string, bool) {
	p := path.Join(mechanism.Home, rel)
	for _, m := range r.Mounts {
		if p == m.Target {
			return m, ".", true
		}
		if below, ok := strings.CutPrefix(p, m.Target+"/"); ok {
			return m, below, true
		}
	}
	return sandbox.Mount{}, "", false
}

// refuseMounted refuses a WriteFile or ReadFile of a path at or beneath
// a host mount in the home: the provider reaches the home through the
// host's directory, under which the mount's target is an empty mount
// point, so the file would be another than the sandbox sees.
func (r *record) refuseMounted(rel string) error {
	if m, _, ok := r.mountAt(rel); ok {
		return sandbox.Invalid("path", fmt.Sprintf("%s is in the host mount %s: use the host's file, or a command in the sandbox", path.Join(mechanism.Home, rel), m))
	}
	return nil
}
