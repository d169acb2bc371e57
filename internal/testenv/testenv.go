// Package testenv is what managoat's tests share about their environment.
//
// Require decides whether a test whose prerequisite is missing may skip. On
// a laptop a test that needs root, a namespace, a cgroup controller or a
// Debian package skips with a clear reason; under CI=true the same missing
// prerequisite is a failure, because a skipped case is not a passed one. A
// kernel feature a supported host may lack by configuration is not a
// prerequisite: see mechanism/hostfacts.
//
// Enclose, called in TestMain, makes sure nothing a test starts outlives
// its test binary, and Sweep ends what a killed one left (see Enclose for
// how; written here because no library encloses a test binary's
// processes, cgroups and mounts together).
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// InCI reports whether the CI environment variable asks for strict mode.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1" || v == "yes"
}

// Require skips t with reason when ok is false, or fails it under CI=true.
func Require(t testing.TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("prerequisite missing under CI=true: %s", reason)
	}
	t.Skipf("prerequisite missing: %s (under CI=true this is a failure)", reason)
}

// RequireRoot is Require(t, os.Geteuid() == 0, ...).
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, os.Geteuid() == 0, "needs root (euid 0)")
}

// Traversable lets every user traverse (not list) dir and each directory
// above it, so a test's unprivileged process can reach what it is given
// below dir (a test's and the enclosure's temporary directories are
// root's only).
func Traversable(dir string) error {
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
				return fmt.Errorf("make %s traversable: %w", d, err)
			}
		}
	}
	return nil
}
