package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEveryCommandIsDocumented: every command the CLI registers is named
// in README.md's architecture section and in docs/architecture.md, so a
// new command cannot ship with neither saying it exists.
func TestEveryCommandIsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, arch, ok := strings.Cut(string(readme), "\n## Architecture\n")
	if !ok {
		t.Fatal("README.md has no ## Architecture section")
	}
	if i := strings.Index(arch, "\n## "); i >= 0 {
		arch = arch[:i]
	}
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(commands) < 20 {
		t.Fatalf("%d commands registered: the table was not read", len(commands))
	}
	for _, c := range commands {
		word := regexp.MustCompile(`(^|[^a-z-])` + regexp.QuoteMeta(c.name) + `($|[^a-z-])`)
		if !word.MatchString(arch) {
			t.Errorf("command %q is not named in README.md's architecture section", c.name)
		}
		if !word.MatchString(string(doc)) {
			t.Errorf("command %q is not named in docs/architecture.md", c.name)
		}
	}
	if !strings.Contains(arch, "docs/") {
		t.Error("README.md's architecture section does not link docs/")
	}
}
