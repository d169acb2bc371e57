package local

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/oci"
	"github.com/managoat/managoat/mechanism/trusted"
)

// openBuiltin opens a built-in mechanism by its CLI name or its Name():
// "jail", "trusted", "oci" (runc), "oci:runsc", "oci:<runtime>", "oci/runc".
// Each keeps its state in its own directory under base.
func openBuiltin(name, base string) (mechanism.Mechanism, bool, error) {
	switch name {
	case "jail":
		// Every managoat process's first sandbox clones the tree
		// template an earlier one pinned (jail.Config).
		m, err := jail.New(jail.Config{StateDir: filepath.Join(base, "jail"), TemplateDir: JailTemplateDir(), Egress: egressConfig()})
		return m, true, err
	case "trusted":
		m, err := trusted.New(filepath.Join(base, "trusted"))
		return m, true, err
	}
	if rt, ok := oci.ParseName(name); ok {
		dir := "oci-" + strings.NewReplacer("/", "-", ":", "-").Replace(filepath.Base(rt))
		m, err := oci.New(oci.Config{Runtime: rt, StateDir: filepath.Join(base, dir), Egress: egressConfig()})
		return m, true, err
	}
	return nil, false, nil
}

func mechanismNames() []string { return []string{"jail", "oci", "oci:runsc", "trusted"} }

// JailTemplateDir is where the jail's tree templates are pinned for the
// next managoat processes: /run/managoat/jail-template as root, for an
// installed binary; "" (no pinning) otherwise.
func JailTemplateDir() string {
	if dir, inTemp := mechanism.DefaultRunDir(); !inTemp && os.Geteuid() == 0 && !exeInTempDir() {
		return filepath.Join(dir, "jail-template")
	}
	return ""
}

// exeInTempDir reports whether this process runs a binary under the
// temporary directory: `go run` and `go test` build one per invocation,
// and pin templates no later process could adopt (a pinned template is
// kept per binary; replacing one tears its mount namespace down, about
// 7 ms here). Only an installed binary pins.
func exeInTempDir() bool {
	exe, err := os.Executable()
	if err != nil {
		return true
	}
	if e, err := filepath.EvalSymlinks(exe); err == nil {
		exe = e
	}
	// go run and go test build under their own work directory, which
	// need not be the temporary directory of the binary it runs (a test
	// enclosure gives its tests their own TMPDIR).
	for _, el := range strings.Split(filepath.Dir(exe), "/") {
		if strings.HasPrefix(el, "go-build") {
			return true
		}
	}
	tmp := os.TempDir()
	if t, err := filepath.EvalSymlinks(tmp); err == nil {
		tmp = t
	}
	rel, err := filepath.Rel(tmp, exe)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
