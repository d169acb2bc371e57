package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/local/journal"
)

// What outlives a supervisor: orphaned sessions reaped, the session
// files written atomically and read back, and the socket's path.

// reapOrphans kills the processes of sessions an earlier supervisor left
// without an exit record (it was killed): their output pipes are gone, so
// they can never be journaled again.
func (s *server) reapOrphans() {
	ents, _ := os.ReadDir(filepath.Join(s.dir, SessionsDir))
	for _, e := range ents {
		d := filepath.Join(s.dir, SessionsDir, e.Name())
		if _, err := os.Stat(filepath.Join(d, exitName)); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, metaName)); err != nil {
			// never started: a half-made session directory
			_ = os.RemoveAll(d)
			continue
		}
		killOrphan(d)
		// What the killed supervisor journaled is in the page cache
		// (a kill does not lose it) but maybe not on the disk: sync it
		// before the mark that says the session is over.
		_ = journal.SyncFile(filepath.Join(d, journalName))
		// Ended with no exit status: listed as lost, not running.
		_ = writeFileAtomic(filepath.Join(d, exitName), []byte("lost"))
	}
}

// KillOrphan kills the process of session id under dir when it is still
// the process the session recorded (its pid and start time match). It is
// for a session whose supervisor is gone.
func KillOrphan(dir, id string) {
	if validID(id) {
		killOrphan(filepath.Join(dir, SessionsDir, id))
	}
}

func killOrphan(d string) {
	b, err := os.ReadFile(filepath.Join(d, metaName))
	if err != nil {
		return
	}
	var m SessionMeta
	if json.Unmarshal(b, &m) != nil || m.Pid <= 1 {
		return
	}
	if m.StartTicks != 0 && startTicks(m.Pid) == m.StartTicks {
		_ = syscall.Kill(-m.Pid, syscall.SIGKILL)
		_ = syscall.Kill(m.Pid, syscall.SIGKILL)
	}
}

// startTicks reads a process's start time from /proc (0 when unknown).
func startTicks(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// writeFileAtomic replaces path with data so that a reader, a later
// supervisor or a host back from a crash finds the old content or the
// new, whole, never a torn or empty file: the data goes to path.tmp,
// which is synced to disk before it is renamed over path, and the
// directory is synced after, so the rename itself is durable when this
// returns. One temporary name per path: a writer killed midway leaves at
// most one path.tmp, which the next write truncates (every state file has
// one writer at a time: the supervisor's lock, or opMu).
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes dir's entries durable (a file renamed or created in it).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadSessions lists the sessions recorded under a sandbox directory,
// oldest first. It reads the disk only, so it works without a supervisor.
func ReadSessions(dir string) ([]SessionMeta, error) {
	ents, err := os.ReadDir(filepath.Join(dir, SessionsDir))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []SessionMeta
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, SessionsDir, e.Name(), metaName))
		if err != nil {
			continue
		}
		var m SessionMeta
		if json.Unmarshal(b, &m) == nil {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(out[i].ID, "s"))
		b, _ := strconv.Atoi(strings.TrimPrefix(out[j].ID, "s"))
		return a < b
	})
	return out, nil
}

// SessionState is session id's state under a sandbox directory, from its
// exit mark: running (no mark yet), exited with its code, or lost (it
// ended with no exit status: its supervisor or the sandbox's init died).
func SessionState(dir, id string) (state string, code int) {
	b, err := os.ReadFile(filepath.Join(dir, SessionsDir, id, exitName))
	if err != nil {
		return "running", 0
	}
	if c, err := strconv.Atoi(string(b)); err == nil {
		return "exited", c
	}
	return "lost", 0
}

// JournalPath is the journal file of session id under a sandbox directory.
func JournalPath(dir, id string) string { return filepath.Join(dir, SessionsDir, id, journalName) }

// HasSession reports whether session id is recorded under dir.
func HasSession(dir, id string) bool {
	if !validID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, SessionsDir, id, metaName))
	return err == nil
}

// listenUnix listens on path; a path longer than a sockaddr allows is
// reached through /proc/self/fd of its directory.
func listenUnix(path string) (net.Listener, error) {
	addr, closeDir, err := sockAddr(path)
	if err != nil {
		return nil, err
	}
	defer closeDir()
	return net.Listen("unix", addr)
}

func sockAddr(path string) (string, func(), error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	d, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), func() { d.Close() }, nil
}
