package local_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/managoat/managoat/provider/local"
)

// TestStateDirIsMadePrivate: a state directory of this user's left open
// (0755, as an older managoat or a mkdir made it) is made 0700 by New,
// so another local user cannot list the sandboxes or reach into them.
func TestStateDirIsMadePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if _, err := local.New(local.Config{StateDir: dir, MechanismName: "trusted"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Fatalf("state dir mode %#o after New, want 0700", got)
	}
}
