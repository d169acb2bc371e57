package local

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// makeWorkDir makes a sandbox's default working directory (CreateOptions.
// Dir) when it is created, as docker does for -w: by `mkdir -p` in the
// sandbox, as its commands' user, so that the directory is theirs however
// the mechanism maps users. A directory that cannot be made (a path the
// user may not write, a file in the way) refuses the create, naming it,
// rather than failing every later exec.
func (p *Provider) makeWorkDir(ctx context.Context, name, dir string) error {
	if !path.IsAbs(dir) {
		return sandbox.Invalid("dir", fmt.Sprintf("working directory %q is not an absolute path", dir))
	}
	r, _, err := p.load(name)
	if err != nil {
		return err
	}
	m, err := p.mechFor(r)
	if err != nil {
		return mechErr("create working directory", err)
	}
	argv, env := p.command(r, m, []string{"mkdir", "-p", "--", dir}, nil)
	comp, err := m.Execute(ctx, r.InstanceID, argv, mechanism.ExecOptions{Env: env, Dir: "/", LimitBytes: 4 << 10})
	if err != nil {
		return mechErr("create working directory", err)
	}
	if comp.ExitStatus != 0 {
		why := strings.TrimSpace(string(comp.Stderr))
		if why == "" {
			why = fmt.Sprintf("mkdir -p ended %d", comp.ExitStatus)
		}
		return sandbox.Invalid("dir", fmt.Sprintf("working directory %s cannot be made in the sandbox by its user: %s", dir, why))
	}
	return nil
}
