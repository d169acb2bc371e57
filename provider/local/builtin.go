package local

import (
	"sort"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// builtin opens each built-in mechanism with its state directory.
var builtin = map[string]func(dir string) (mechanism.Mechanism, error){
	"jail": func(dir string) (mechanism.Mechanism, error) { return jail.New(jail.Config{StateDir: dir}) },
}

func mechanismNames() []string {
	names := make([]string, 0, len(builtin))
	for n := range builtin {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
