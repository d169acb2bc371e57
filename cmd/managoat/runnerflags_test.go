package main

import (
	"flag"
	"io"
	"testing"

	"github.com/managoat/managoat/runner"
)

// TestRunnerDefaultDisk: the daemon's --default-disk reaches
// runner.Config.DefaultDiskBytes (the quota of a create without one,
// which the daemon bounds by its share of the homes' free space:
// runner's TestDiskBounds), and a bad size is refused.
func TestRunnerDefaultDisk(t *testing.T) {
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := runnerFleetFlags(fs)
	if err := fs.Parse([]string{"--default-disk", "10G"}); err != nil {
		t.Fatal(err)
	}
	var c runner.Config
	f.apply(&c)
	if c.DefaultDiskBytes != 10<<30 {
		t.Fatalf("DefaultDiskBytes %d, want %d", c.DefaultDiskBytes, int64(10<<30))
	}
	fs2 := flag.NewFlagSet("runner", flag.ContinueOnError)
	fs2.SetOutput(io.Discard)
	runnerFleetFlags(fs2)
	if err := fs2.Parse([]string{"--default-disk", "lots"}); err == nil {
		t.Fatal("--default-disk lots accepted")
	}
}
