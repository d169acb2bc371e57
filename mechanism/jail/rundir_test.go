package jail_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/jail"
)

// TestRunDirOfAnotherUserRefused: a run directory another local user
// made first (/tmp/managoat-UID is a name anyone can take), a link to
// one, or one others can write is refused by New: whoever holds it could
// put a socket of theirs where the manager dials its sandboxes.
func TestRunDirOfAnotherUserRefused(t *testing.T) {
	testenv.RequireRoot(t) // to make a directory of another user's
	base := t.TempDir()
	squatted := filepath.Join(base, "squatted")
	if err := os.Mkdir(squatted, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(squatted, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(squatted, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, want string }{
		{squatted, "belongs to uid 65534"},
		{open, "mode 777"},
		{link, "not a directory"},
	} {
		_, err := jail.New(jail.Config{StateDir: filepath.Join(base, "state"), RunDir: c.dir})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with run directory %s: %v, want an error saying %q", c.dir, err, c.want)
		}
	}
	if _, err := jail.New(jail.Config{StateDir: filepath.Join(base, "state"), RunDir: filepath.Join(base, "mine")}); err != nil {
		t.Errorf("New with a run directory of its own: %v", err)
	}
}
