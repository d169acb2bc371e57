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
		cfg := jail.Config{StateDir: filepath.Join(base, "jail")}
		if dir, inTemp := mechanism.DefaultRunDir(); !inTemp && os.Geteuid() == 0 {
			// Every managoat process's first sandbox clones the tree
			// template an earlier one pinned there (jail.Config).
			cfg.TemplateDir = filepath.Join(dir, "jail-template")
		}
		m, err := jail.New(cfg)
		return m, true, err
	case "trusted":
		m, err := trusted.New(filepath.Join(base, "trusted"))
		return m, true, err
	}
	if rt, ok := oci.ParseName(name); ok {
		dir := "oci-" + strings.NewReplacer("/", "-", ":", "-").Replace(filepath.Base(rt))
		m, err := oci.New(oci.Config{Runtime: rt, StateDir: filepath.Join(base, dir)})
		return m, true, err
	}
	return nil, false, nil
}

func mechanismNames() []string { return []string{"jail", "oci", "oci:runsc", "trusted"} }
