package egress

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/managoat/managoat/mechanism"
)

// The unix sockets of published ports live in one directory per user,
// PortsDir, named by the published port's loopback TCP port (unique on
// the host while it listens), so that any process of the same user (a
// CLI, `managoat serve`) finds the socket of a published address with
// SocketFor without knowing which mechanism published it.

// maxSocketPath is the longest path bind(2) takes for a unix socket
// (sun_path is 108 bytes with its NUL).
const maxSocketPath = 107

// PortsDir is the directory of this user's published ports' unix
// sockets: "ports" in mechanism.DefaultRunDir (/run/managoat as root,
// $XDG_RUNTIME_DIR/managoat, else managoat-UID in the temporary
// directory), made 0700 if missing. It is an error, and no socket is
// made or trusted there, unless it and the run directory are
// directories (not links) of this user's that no other user can write
// (the run directory) or enter (the ports directory), so that no other
// user can put a socket there or open one.
func PortsDir() (string, error) {
	run, _ := mechanism.DefaultRunDir()
	dir := filepath.Join(run, "ports")
	if len(dir)+len("/65535") > maxSocketPath {
		return "", fmt.Errorf("%s: too long a path for a unix socket", dir)
	}
	if err := os.MkdirAll(run, 0o700); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if err := private(run, 0o022); err != nil {
		return "", err
	}
	if err := private(dir, 0o077); err != nil {
		return "", err
	}
	return dir, nil
}

// private checks that dir is a directory of this user's, not a link,
// with none of the mode bits in forbid.
func private(dir string, forbid fs.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user", dir)
	case fi.Mode().Perm()&forbid != 0:
		return fmt.Errorf("%s is mode %o: another user could reach what is in it", dir, fi.Mode().Perm())
	}
	return nil
}

// listenPrivate listens on a unix socket at path (in PortsDir), mode
// 0600, removing a socket a process that died left there.
func listenPrivate(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		os.Remove(path) // the TCP port is ours now: its socket is stale
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// SocketFor is the path of the unix socket of the published port whose
// loopback address is addr ("127.0.0.1:PORT", as PublishedAddr gives),
// published by a process of this user's: an error when PortsDir is not
// private or holds no socket of this user's for it (a port published by
// an older managoat, which made none).
func SocketFor(addr string) (string, error) {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if n, err := strconv.Atoi(ps); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%q: not a published port's address", addr)
	}
	dir, err := PortsDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, ps)
	fi, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != fs.ModeSocket || !ok || int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("%s is not a socket of this user's", path)
	}
	return path, nil
}
