package main

import (
	"sync/atomic"
	"testing"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// closingFake is the fake provider with a Close that counts.
type closingFake struct {
	*fake.Provider
	closed *atomic.Int32
}

func (c closingFake) Close() error {
	c.closed.Add(1)
	return c.Provider.Close()
}

// TestCommandsCloseTheirProviders: a command closes the provider it opened
// before managoat exits (E2B's Close waits for the process-tree kill of a
// timed-out exec, which would otherwise die with the process), whether the
// command succeeds or fails.
func TestCommandsCloseTheirProviders(t *testing.T) {
	var closed atomic.Int32
	registerProvider("closing-fake", func() (sandbox.Provider, error) {
		return closingFake{fake.New(), &closed}, nil
	})
	saved := *current
	t.Cleanup(func() { *current = saved })
	if code := run([]string{"--provider", "closing-fake", "ls"}); code != 0 {
		t.Fatalf("ls exited %d", code)
	}
	if n := closed.Load(); n != 1 {
		t.Fatalf("ls closed its provider %d times, want 1", n)
	}
	if code := run([]string{"--provider", "closing-fake", "exec", "no-such-box", "--", "true"}); code == 0 {
		t.Fatal("exec in a missing sandbox exited 0")
	}
	if n := closed.Load(); n != 2 {
		t.Fatalf("after a failed exec the provider was closed %d times in all, want 2", n)
	}
}
