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
	"os"
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
