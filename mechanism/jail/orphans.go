package jail

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// orphanAge is how old a leftover must be before SweepOrphans takes it: a
// start in flight makes its cgroups and its control socket moments before
// it puts the init in the one and listens on the other.
var orphanAge = time.Minute

// orphanScope, when set (by tests), limits the cgroups SweepOrphans looks
// at to the names it accepts.
var orphanScope func(name string) bool

// cgroupPrefix begins the name of every jail sandbox's cgroups; the
// jail's hash and the sandbox id follow (launch).
const cgroupPrefix = "managoat-jail-"

// socketName matches the name of a control socket in the run directory.
var socketName = regexp.MustCompile(`^[0-9a-f]{16}\.sock$`)

// SweepOrphans removes what sandboxes left on the host when their state
// went without a Destroy (a state directory deleted whole, a process
// killed half-way through a Destroy): Destroy, Stop and Start clean up
// every sandbox whose state is still there, but nothing else finds these.
// It returns the paths it removed.
//
//   - A cgroup of this Jail (named for its state directory's path and
//     inode) whose sandbox has no state: its processes are killed and the
//     cgroup removed, under the lock Provision takes.
//   - An empty cgroup of any jail, sibling of the ones this process would
//     make: the kernel refuses to remove a cgroup that has processes or
//     children, so a running sandbox's cannot go, whichever state
//     directory it belongs to.
//   - A control socket in the run directory that nobody listens on.
//   - A state directory a Destroy set aside (.destroy-*) and was killed
//     before it removed it.
//
// Only leftovers older than a minute are touched, so a start in flight
// in another process is never hurt. Errors of single removals are
// returned joined; the sweep goes on past them.
func (j *Jail) SweepOrphans(ctx context.Context) ([]string, error) {
	var removed []string
	var errs []error
	if l, err := mechanism.CgroupLayout(); err == nil && l.Mode != cgroups.ModeNone {
		r, err := j.sweepCgroups(ctx, l)
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	r, err := sweepSockets(j.cfg.RunDir)
	removed = append(removed, r...)
	errs = append(errs, err)
	r, err = sweepSetAside(j.cfg.StateDir)
	removed = append(removed, r...)
	errs = append(errs, err)
	return removed, errors.Join(errs...)
}

// sweepSetAside removes the .destroy-* directories of Destroys that did
// not finish: the sandbox was stopped before its state went aside, and
// its cgroups, named for an id whose state is gone, are swept above.
func sweepSetAside(stateDir string) ([]string, error) {
	ents, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		p := filepath.Join(stateDir, e.Name())
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".destroy-") || !old(p) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// old reports whether path was last changed over orphanAge ago.
func old(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return false
	}
	return time.Since(time.Unix(st.Ctim.Unix())) > orphanAge
}

func (j *Jail) sweepCgroups(ctx context.Context, l *cgroups.Layout) ([]string, error) {
	parents := []string{}
	if l.V2 != "" {
		parents = append(parents, l.V2)
	}
	for _, d := range l.V1 {
		if !slices.Contains(parents, d) { // cpu and cpuacct may share one
			parents = append(parents, d)
		}
	}
	mine := cgroupPrefix + j.hash + "-"
	all := cgroups.Limits{MemoryBytes: 1, Pids: 1, CPUMillis: 1}
	var removed []string
	var errs []error
	done := map[string]bool{}
	for _, parent := range parents {
		ents, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if !e.IsDir() || !strings.HasPrefix(name, cgroupPrefix) || done[name] ||
				(orphanScope != nil && !orphanScope(name)) {
				continue
			}
			path := filepath.Join(parent, name)
			if !old(path) {
				continue
			}
			if id, ok := strings.CutPrefix(name, mine); ok && mechanism.ValidateID(id) == nil {
				// Under the lock Provision takes: no sandbox of this id
				// can be made (and started, into a cgroup of this name)
				// between the look and the kill.
				unlock, err := flock.Lock(ctx, j.cfg.StateDir)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if _, err := os.Lstat(j.dir(id)); !errors.Is(err, fs.ErrNotExist) {
					unlock()
					continue // its sandbox's own cleanup takes it
				}
				done[name] = true
				g := l.OpenFor(name, all)
				var dirs []string
				for _, d := range g.Dirs() {
					if _, err := os.Lstat(d); err == nil && !slices.Contains(dirs, d) {
						dirs = append(dirs, d)
					}
				}
				g.Kill()
				err = g.Remove(ctx)
				unlock()
				if err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, dirs...)
				continue
			}
			// Another jail's: only if empty, which rmdir alone decides.
			if unix.Rmdir(path) == nil {
				removed = append(removed, path)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// sweepSockets removes the control sockets in dir that refuse a
// connection: their init is gone (a live init listens from before its
// socket is old enough to be looked at, until Destroy removes it).
func sweepSockets(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if e.Type() != fs.ModeSocket || !socketName.MatchString(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		id, ok := socketID(path)
		if !ok || !old(path) || !refused(path) {
			continue
		}
		if gone, err := removeDeadSocket(dir, path, id); err != nil {
			errs = append(errs, err)
		} else if gone {
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// removeDeadSocket removes the socket at path, judged dead as st, unless a
// start replaced it meanwhile (its init removes the old socket and binds a
// new one at the same path): the socket is first moved to a private name,
// where it is checked to be the one judged and still refusing; a newer one
// is moved back, and gone is false. What is left is a start caught between
// its bind and its listen (two consecutive system calls) whose new socket
// has the inode number and birth time of the dead one, the file system
// having reused both: that sandbox loses its control socket until its next
// start.
func removeDeadSocket(dir, path string, judged fileIdentity) (gone bool, err error) {
	aside := filepath.Join(dir, ".sweep-"+randHex())
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
		if err == unix.ENOENT {
			return false, nil // removed meanwhile
		}
		return false, &fs.PathError{Op: "rename", Path: path, Err: err}
	}
	if now, ok := socketID(aside); ok && now == judged && refused(aside) {
		if err := unix.Unlink(aside); err != nil {
			return false, &fs.PathError{Op: "unlink", Path: aside, Err: err}
		}
		return true, nil
	}
	if err := unix.Renameat2(unix.AT_FDCWD, aside, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		// An even newer socket took the name: the one set aside is stale.
		_ = unix.Unlink(aside)
	}
	return false, nil
}

// fileIdentity tells a file from one made later at the same path: its
// device, inode number and birth time (an inode number freed by a removal
// is soon given to the next file).
type fileIdentity struct {
	dev, ino   uint64
	btime      int64
	btimeNsec  uint32
	btimeKnown bool
}

// socketID is the identity of the socket at path (not followed); ok is
// false for anything else.
func socketID(path string) (id fileIdentity, ok bool) {
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BTIME, &sx); err != nil {
		return id, false
	}
	if sx.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return id, false
	}
	id = fileIdentity{dev: unix.Mkdev(sx.Dev_major, sx.Dev_minor), ino: sx.Ino}
	if sx.Mask&unix.STATX_BTIME != 0 {
		id.btime, id.btimeNsec, id.btimeKnown = sx.Btime.Sec, sx.Btime.Nsec, true
	}
	return id, true
}

// refused reports whether a connection to the socket at path is refused:
// nothing listens on it. A full backlog (EAGAIN) is not a refusal.
func refused(path string) bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path}) == unix.ECONNREFUSED
}
