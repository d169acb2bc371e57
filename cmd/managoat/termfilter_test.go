package main

import (
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// escapeOutput is what the workload prints: an OSC 52 clipboard write
// between two letters, then red text.
const escapeOutput = `printf 'a\033]52;c;cm0gLXJmIH4K\007b\033[31mred\033[0m\n'`

// TestEscapesShownOnATerminal: a session's escape sequences reach
// managoat's terminal as text when managoat did not allocate a terminal
// for the session (logs; exec without -t), colours pass, and a pipe gets
// the bytes unchanged. Fails on the old code: the terminal got the OSC 52
// sequence itself.
func TestEscapesShownOnATerminal(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"}
	if _, e, code := managoatEnv(t, env, "create", "esc"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "esc") })
	out, e, code := managoatEnv(t, env, "exec", "esc", "--", "sh", "-c", escapeOutput)
	if code != 0 || out != "a\x1b]52;c;cm0gLXJmIH4K\x07b\x1b[31mred\x1b[0m\n" {
		t.Fatalf("exec to a pipe: exit %d %q %s (want the bytes unchanged)", code, out, e)
	}
	if out, _, code := managoatEnv(t, env, "logs", "esc"); code != 0 || !strings.Contains(out, "\x1b]52;c;") {
		t.Errorf("logs to a pipe: exit %d %q (want the bytes unchanged)", code, out)
	}
	shown := "a^[]52;c;cm0gLXJmIH4K^Gb\x1b[31mred\x1b[0m"
	r := startOnPTY(t, env, "logs", "esc")
	r.expect(shown)
	if code := r.wait(); code != 0 {
		t.Errorf("logs on a terminal: exit %d", code)
	}
	r = startOnPTY(t, env, "exec", "esc", "--", "sh", "-c", escapeOutput)
	r.expect(shown)
	if code := r.wait(); code != 0 {
		t.Errorf("exec without -t on a terminal: exit %d", code)
	}
}
