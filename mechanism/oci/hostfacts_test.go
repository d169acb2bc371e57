package oci_test

import (
	"context"
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism"
)

// TestHostFactsMasked: what the jail masks is masked in an OCI sandbox
// too: /proc/key-users (every host user's key counts), /proc/kallsyms
// (the host kernel's symbols) and /proc/config.gz read empty, and
// io_setup, which draws on the host-wide AIO limit, is ENOSYS.
func TestHostFactsMasked(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			m := newMech(t, rt, t.TempDir())
			id := tid("facts")
			started(t, m, id, mechanism.Spec{})
			ctx := context.Background()
			for _, p := range []string{"/proc/key-users", "/proc/kallsyms", "/proc/config.gz"} {
				c, err := m.Execute(ctx, id, []string{"sh", "-c", "test -e " + p + " || { echo absent; exit 0; }; wc -c < " + p}, mechanism.ExecOptions{})
				if err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				if out := strings.TrimSpace(string(c.Stdout)); out != "0" && out != "absent" {
					t.Errorf("%s reads %s bytes in the sandbox, want none (stderr %q)", p, out, c.Stderr)
				}
			}
			if rt == "runsc" {
				return // gVisor implements its own AIO, on no host limit
			}
			// io_setup(4096, &ctx): x86-64 number 206.
			py := `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
r = libc.syscall(206, 4096, ctypes.byref(ctx))
print(r, ctypes.get_errno())`
			c, err := m.Execute(ctx, id, []string{"python3", "-c", py}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if out := strings.TrimSpace(string(c.Stdout)); out != "-1 38" {
				t.Errorf("io_setup in the sandbox: %q (stderr %q), want -1 38 (ENOSYS)", out, c.Stderr)
			}
		})
	}
}
