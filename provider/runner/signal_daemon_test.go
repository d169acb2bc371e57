package runner_test

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// TestSignalThroughTheDaemon (issue 31, 5): a real daemon serving
// provider/local reports the signal capability and serves the signal op,
// so SIGINT from the platform reaches the session's command, whose trap
// runs and whose own exit comes back (before, the daemon reported no
// capability and the platform could only kill the command).
func TestSignalThroughTheDaemon(t *testing.T) {
	p, name := localOverWire(t, "trusted")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := p.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c",
		`trap 'echo trapped; exit 3' INT; echo ready; while :; do sleep 0.05; done`}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	signalled := false
	for ev := range c.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			out.Write(ev.Data)
			if !signalled && strings.Contains(out.String(), "ready") {
				signalled = true
				if err := p.SignalCommand(ctx, c, syscall.SIGINT); err != nil {
					t.Fatalf("SignalCommand: %v", err)
				}
			}
		case sandbox.Exit:
			if ev.Code != 3 || !strings.Contains(out.String(), "trapped") {
				t.Fatalf("exit %d, output %q: want the trap's exit 3 and its line", ev.Code, out.String())
			}
			return
		case sandbox.Error:
			t.Fatalf("session error: %v (output %q)", ev.Err, out.String())
		}
	}
	t.Fatalf("events closed without an exit; output %q", out.String())
}
