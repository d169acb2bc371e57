package jail

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveDeadSocketLeavesAReplacement: a dead socket that a start
// replaces with a listening one between the sweep's look and its removal
// stays: the live one is at its path afterwards, and nothing is left
// aside; a socket still dead is removed.
func TestRemoveDeadSocketLeavesAReplacement(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "00000000000000aa.sock")
	bind := func(listen bool) int { return BindTestSocket(t, path, listen) }
	unix.Close(bind(false))
	dead, ok := socketID(path)
	if !ok {
		t.Fatal("no identity for a socket")
	}
	// The start: the old socket removed, a new one bound and listening.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	live := bind(true)
	if gone, err := removeDeadSocket(dir, path, dead); gone || err != nil {
		unix.Close(live)
		t.Fatalf("removeDeadSocket = %v, %v; want the live replacement kept", gone, err)
	}
	if refused(path) {
		unix.Close(live)
		t.Fatal("the live socket is no longer at its path")
	}
	// The socket judged dead, still dead: removed.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	unix.Close(live)
	unix.Close(bind(false))
	now, ok := socketID(path)
	if !ok {
		t.Fatal("no identity for a socket")
	}
	if gone, err := removeDeadSocket(dir, path, now); !gone || err != nil {
		t.Fatalf("removeDeadSocket = %v, %v; want the dead socket removed", gone, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left in the run directory: %v", ents)
	}
}
