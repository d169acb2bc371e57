package jail

import (
	"fmt"
	"os"
	"syscall"
)

// privateRunDir refuses a run directory (the sandboxes' control sockets)
// that is not this user's own: without RunDir set and without
// XDG_RUNTIME_DIR it is /tmp/managoat-UID, a name another local user can
// make first, and whoever owns the directory can put a socket of theirs
// where the manager dials its sandboxes' inits. A link, another owner,
// or a mode others can write is an error naming the directory.
func privateRunDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("jail: run directory %s is not a directory (a link?)", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("jail: run directory %s belongs to uid %d, not this user: another user could answer for its sandboxes", dir, st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("jail: run directory %s is mode %o: another user could replace its sockets", dir, fi.Mode().Perm())
	}
	return nil
}
