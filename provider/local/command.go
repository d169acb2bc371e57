package local

import (
	"path"
	"slices"
	"strings"

	"github.com/managoat/managoat/mechanism"
)

// hostPaths reports whether m's sandboxes see host paths (no filesystem
// confinement, like trusted): /home/sprite does not exist for them.
func hostPaths(m mechanism.Mechanism) bool {
	c := mechanism.FilesystemConfinement
	return !slices.Contains(mechanism.Guaranteed(m), c) && !slices.Contains(mechanism.Constructed(m), c)
}

// command builds the argv and environment a command runs with, as the
// runner's trusted mode did (spec: runner-protocol §2.3, §2.4):
//
//   - on a mechanism whose sandboxes see host paths, every occurrence of
//     /home/sprite in the command and its arguments is replaced by the
//     sandbox's home directory (environment values are not rewritten);
//   - PATH starts with the home's .local/bin, .npm-global/bin and
//     .bun/bin, then the default PATH, and npm_config_prefix is the home's
//     .npm-global, so tools an agent installs there are found.
//
// The sandbox's own Env (CreateOptions) comes next, and the caller's env
// last, overriding all.
func (p *Provider) command(r *record, m mechanism.Mechanism, argv, env []string) ([]string, []string) {
	home := mechanism.Home
	if hostPaths(m) {
		home = p.homeDir(r.InstanceID)
		out := make([]string, len(argv))
		for i, a := range argv {
			out[i] = strings.ReplaceAll(a, mechanism.Home, home)
		}
		argv = out
	}
	base := []string{
		"PATH=" + strings.Join([]string{path.Join(home, ".local/bin"), path.Join(home, ".npm-global/bin"),
			path.Join(home, ".bun/bin"), mechanism.DefaultPath}, ":"),
		"npm_config_prefix=" + path.Join(home, ".npm-global"),
	}
	return argv, append(append(base, r.Env...), env...)
}
