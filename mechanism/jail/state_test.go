package jail

import (
	"os"
	"path/filepath"
	"testing"
)

// The state file is rewritten in place; a reader detects a half-written
// one by its checksum, and reads a file from an earlier version (no sum).
func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	long := &state{Mechanism: "jail", ID: "a", Note: string(make([]byte, 5000))}
	for _, st := range []*state{long, {Mechanism: "jail", ID: "b", Status: "running", InitPid: 42}} {
		if err := writeState(dir, st); err != nil {
			t.Fatal(err)
		}
		got, err := readState(dir)
		if err != nil || got.ID != st.ID || got.InitPid != st.InitPid {
			t.Fatalf("read back %+v, %v; wrote %s", got, err, st.ID)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, "state.json")); fi.Size() != statePage {
		t.Errorf("a shorter state left a %d-byte file", fi.Size())
	}
	// Half old, half new: the sum does not match.
	a, _ := os.ReadFile(filepath.Join(dir, "state.json"))
	if err := writeState(dir, &state{Mechanism: "jail", ID: "c", Status: "stopped"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "state.json"))
	torn := append(append([]byte{}, b[:40]...), a[40:]...)
	if string(torn) == string(a) || string(torn) == string(b) {
		t.Fatal("the test's two states share their first 40 bytes")
	}
	if _, err := decodeState(torn); err == nil {
		t.Error("a torn state was accepted")
	}
	if st, err := decodeState([]byte(`{"mechanism":"jail","id":"old","status":"running"}`)); err != nil || st.ID != "old" {
		t.Errorf("a state written by an earlier version: %+v, %v", st, err)
	}
}
