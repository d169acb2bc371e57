package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// devptsMagic is DEVPTS_SUPER_MAGIC.
const devptsMagic = 0x1cd1

// OpenTerminal opens a pseudo-terminal pair in the running sandbox's own
// devpts (mechanism.Terminals): its ptmx is reached through the init's
// root (/proc/<init>/root), resolved inside that root without following
// any symbolic link, and is used only if it is a devpts ptmx; the slave
// is the master's peer (TIOCGPTPEER), never looked up by name. A
// sandbox's processes cannot make it open anything else: whatever they
// put at /dev/pts is refused, not followed.
func (j *Jail) OpenTerminal(ctx context.Context, id string) (master, slave *os.File, err error) {
	if err := mechanism.ValidateID(id); err != nil {
		return nil, nil, err
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return nil, nil, err
	}
	if st.InitPid <= 0 {
		return nil, nil, fmt.Errorf("%w: sandbox %s is not running", mechanism.ErrNotRunning, id)
	}
	proc, err := unix.Open("/proc/"+strconv.Itoa(st.InitPid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: sandbox %s's init: %v", mechanism.ErrNotRunning, id, err)
	}
	defer unix.Close(proc)
	root, err := unix.Openat(proc, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s's root: %w", id, err)
	}
	defer unix.Close(root)
	// The pid is the init's still (not a process that took its number
	// since the state was read): its start time matches, read after the
	// root was opened.
	if start, _ := procStart(st.InitPid); start == 0 || start != st.InitStart {
		return nil, nil, fmt.Errorf("%w: sandbox %s's init is gone", mechanism.ErrNotRunning, id)
	}
	fd, err := openPtmx(root)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("unlock the terminal: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("open the terminal's peer: %w", errno)
	}
	// The master stays non-blocking, so its File is pollable (reads take
	// deadlines); the slave is the process's, blocking.
	m := os.NewFile(uintptr(fd), "/dev/pts/ptmx (the sandbox's)")
	sl := os.NewFile(sfd, "/dev/pts (the sandbox's)")
	// The terminal is the workload's, as a login's is: owned by the
	// sandbox's user (the home's owner), so a program that reopens it by
	// name (script, su, ssh's client) may.
	var home unix.Stat_t
	if err := unix.Stat(st.HomeDir, &home); err == nil {
		_ = sl.Chown(int(home.Uid), int(home.Gid))
	}
	return m, sl, nil
}

// openPtmx opens dev/pts/ptmx under the directory root, resolved inside
// it with no symbolic link followed, and only if it is a devpts ptmx. It
// is opened non-blocking (a FIFO put there cannot hold the open) and
// stays so.
func openPtmx(root int) (int, error) {
	fd, err := unix.Openat2(root, "dev/pts/ptmx", &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("/dev/pts/ptmx: %w", err)
	}
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Type != devptsMagic ||
		unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 {
		unix.Close(fd)
		return -1, errors.New("/dev/pts/ptmx is not a devpts ptmx")
	}
	return fd, nil
}
