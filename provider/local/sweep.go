package local

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/supervisor"
)

// sweepAge is how old leftovers must be before Sweep removes them, so a
// creation or destruction in flight in another process is never touched.
const sweepAge = time.Minute

// Sweep finishes what a process killed in the middle of Create or Destroy
// left behind: records under construction, destroyed records not yet
// removed, and instances (disks and mechanism sandboxes) that no sandbox
// refers to. None of these is visible to ListAllNames; Sweep releases
// their resources. Only leftovers older than a minute are touched, and
// never one whose Create or Destroy still runs (it holds a lock on its
// mark, however long it takes). New calls it.
//
// Every ten minutes at most (a stamp in tmp says when), it also has the
// mechanism remove what sandboxes whose state is gone left on the host
// (mechanism.OrphanSweeper), and logs each removal.
func (p *Provider) Sweep(ctx context.Context) error {
	p.sweepOrphans(ctx)
	tmp := filepath.Join(p.state, "tmp")
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return stateErr("sweep", err)
	}
	old := func(path string) bool {
		st, err := os.Lstat(path)
		return err == nil && time.Since(st.ModTime()) > sweepAge
	}
	inFlight := map[string]bool{}
	marks := map[string]string{} // instance id -> its old mark, removed once the instance is
	leftovers := false
	for _, e := range ents {
		path := filepath.Join(tmp, e.Name())
		var iid string
		switch {
		case strings.HasPrefix(e.Name(), "trash-"):
			iid = strings.SplitN(strings.TrimPrefix(e.Name(), "trash-"), "-", 2)[0]
		case strings.HasPrefix(e.Name(), "new-"):
			iid = strings.TrimPrefix(e.Name(), "new-")
		case strings.HasPrefix(e.Name(), "probe-") && old(path):
			_ = os.Remove(path)
			continue
		default:
			continue
		}
		if !old(path) {
			inFlight[iid] = true
			continue
		}
		unlock, ok := flock.TryLock(path)
		if !ok { // its Create or Destroy still runs
			inFlight[iid] = true
			continue
		}
		defer unlock()
		leftovers = true
		if r, err := readRecord(path); err == nil && strings.HasPrefix(e.Name(), "trash-") {
			// A Destroy cut short: finish it; the mark goes with the
			// instance, below, or stays for the next Sweep.
			_ = (supervisor.Client{Dir: path}).Shutdown(ctx, true)
			m, err := p.mechFor(r)
			if err == nil {
				err = m.Destroy(ctx, r.InstanceID)
			}
			if err != nil {
				inFlight[iid] = true // not torn down: keep its instance
				continue
			}
			iid = r.InstanceID
		}
		marks[iid] = path
	}
	defer func() {
		for iid, mark := range marks {
			if _, err := os.Lstat(p.instanceDir(iid)); errors.Is(err, fs.ErrNotExist) {
				_ = os.RemoveAll(mark)
			}
		}
	}()
	// Instances no sandbox refers to. An instance that no sandbox refers
	// to has a mark in tmp: Create makes tmp/new-<id> before the instance
	// and removes it only after the instance (or with the record renamed
	// into place), and Destroy renames the record there and removes it
	// after the instance, as this Sweep does. With no old mark, and no
	// more instances than sandboxes (which also catches what an older
	// version left), there is nothing to find, and neither directory is
	// listed nor a record read: every command opens the provider, and its
	// cost must not grow with the number of sandboxes (subdirs, O(1)
	// where the file system counts a directory's subdirectories).
	if !leftovers {
		ni, err1 := subdirs(filepath.Join(p.state, "instances"))
		ns, err2 := subdirs(filepath.Join(p.state, "sandboxes"))
		if err1 == nil && err2 == nil && ni <= ns {
			return nil
		}
	}
	names, err := p.ListAllNames(ctx)
	if err != nil {
		return err
	}
	insts, err := os.ReadDir(filepath.Join(p.state, "instances"))
	if err != nil {
		return stateErr("sweep", err)
	}
	if !leftovers && len(insts) <= len(names) {
		return nil
	}
	used := map[string]bool{}
	for _, n := range names {
		if r, _, err := p.load(n); err == nil {
			used[r.InstanceID] = true
		}
	}
	for _, e := range insts {
		iid := e.Name()
		path := p.instanceDir(iid)
		if used[iid] || inFlight[iid] || !old(path) {
			continue
		}
		// Re-check: a sandbox may have claimed it since the listing.
		if p.instanceUsed(iid) {
			continue
		}
		if p.mech.Destroy(ctx, iid) == nil {
			p.releaseImage(iid)
			_ = removeAll(ctx, path)
		}
	}
	return nil
}

// subdirs counts the entries of directory dir (a sandbox's and an
// instance's are directories): from its link count (two plus one for each
// subdirectory's "..") where the file system keeps it so, as ext4, xfs and
// tmpfs do, which is one stat whatever the number; else by listing it
// (names and types only, nothing stat'ed).
func subdirs(dir string) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, err
	}
	if st.Nlink >= 2 {
		return int(st.Nlink) - 2, nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(512)
		n += len(names)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *Provider) instanceUsed(iid string) bool {
	names, err := p.ListAllNames(context.Background())
	if err != nil {
		return true
	}
	for _, n := range names {
		if r, _, err := p.load(n); err != nil || r.InstanceID == iid {
			return true
		}
	}
	return false
}

// readRecord reads the record in a sandbox's directory; a record that
// does not decode is a *recordError.
func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, &recordError{err}
	}
	return &r, nil
}

// recordError is a record that does not decode.
type recordError struct{ err error }

func (e *recordError) Error() string { return "corrupt record: " + e.err.Error() }
func (e *recordError) Unwrap() error { return e.err }

// orphanInterval is how often Sweep has the mechanism look for orphans:
// listing the cgroup hierarchies and the run directory is not work for
// every command.
const orphanInterval = 10 * time.Minute

// sweepOrphans runs the mechanism's orphan sweep, for two seconds at
// most, when the stamp in tmp is older than orphanInterval (or missing, or
// dated in the future), once it has renewed the stamp: two processes
// racing both sweep, which is harmless. A stamp it cannot renew (not a
// regular file of ours) means no sweep, rather than one on every command.
func (p *Provider) sweepOrphans(ctx context.Context) {
	s, ok := p.mech.(mechanism.OrphanSweeper)
	if !ok {
		return
	}
	stamp := filepath.Join(p.state, "tmp", "orphans-swept")
	if st, err := os.Lstat(stamp); err == nil {
		if age := time.Since(st.ModTime()); age >= 0 && age < orphanInterval {
			return
		}
	}
	f, err := os.OpenFile(stamp, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return
	}
	now := time.Now()
	err = unix.Futimes(int(f.Fd()), []unix.Timeval{unix.NsecToTimeval(now.UnixNano()), unix.NsecToTimeval(now.UnixNano())})
	f.Close()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	removed, err := s.SweepOrphans(ctx)
	for _, r := range removed {
		p.log.Info("removed what a sandbox whose state is gone left on the host", "path", r)
	}
	if err != nil {
		p.log.Warn("sweep orphans", "err", err)
	}
}
