package local

import (
	"os"
	"syscall"
)

// privateStateDir makes the state directory 0700 when it is this user's
// and open to others: a directory an older managoat (or a user's mkdir)
// left 0755 showed every sandbox's name and let another local user reach
// whatever a subdirectory left open. One owned by someone else (a shared
// parent given as the state dir) is left as it is.
func privateStateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	return os.Chmod(dir, fi.Mode().Perm()&0o700|0o700)
}
