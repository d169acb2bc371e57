package supervisor

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/managoat/managoat/provider/local/journal"
)

// RetentionName is the file under a sandbox directory holding its
// journals' retention (a journal.Retention in JSON); without it the
// sandbox has journal.DefaultRetention.
const RetentionName = "retention.json"

// prunedName marks a session whose journal the retention pruned; it holds
// why.
const prunedName = "pruned"

// ReadRetention is the retention of the sandbox under dir.
func ReadRetention(dir string) journal.Retention {
	b, err := os.ReadFile(filepath.Join(dir, RetentionName))
	if err != nil {
		return journal.DefaultRetention
	}
	var r journal.Retention
	if json.Unmarshal(b, &r) != nil {
		return journal.DefaultRetention
	}
	return r
}

// WriteRetention records r as the retention of the sandbox under dir.
func WriteRetention(dir string, r journal.Retention) error {
	b, _ := json.Marshal(r)
	return writeFileAtomic(filepath.Join(dir, RetentionName), b)
}

// Pruned says why session id's journal under dir was pruned, if it was.
func Pruned(dir, id string) (why string, pruned bool) {
	b, err := os.ReadFile(filepath.Join(dir, SessionsDir, id, prunedName))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// prune removes the journals of finished sessions that the sandbox's
// retention no longer keeps, and marks each session pruned with why. It
// runs when the supervisor starts and whenever a session ends.
func (s *server) prune() {
	pol := ReadRetention(s.dir)
	ents, _ := os.ReadDir(filepath.Join(s.dir, SessionsDir))
	var all []journal.Entry
	for _, e := range ents {
		d := filepath.Join(s.dir, SessionsDir, e.Name())
		st, err := os.Stat(filepath.Join(d, journalName))
		if err != nil {
			continue // none, or already pruned
		}
		size := st.Size()
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			size = sys.Blocks * 512 // a capped journal is sparse
		}
		en := journal.Entry{ID: e.Name(), Size: size}
		if x, err := os.Stat(filepath.Join(d, exitName)); err == nil {
			en.Ended = x.ModTime()
		}
		all = append(all, en)
	}
	ids, why := pol.Select(all, time.Now())
	for i, id := range ids {
		d := filepath.Join(s.dir, SessionsDir, id)
		// The mark first: a session with no journal and no mark would look
		// lost rather than pruned.
		if err := writeFileAtomic(filepath.Join(d, prunedName), []byte(why[i])); err != nil {
			continue
		}
		_ = os.Remove(filepath.Join(d, journalName+journal.HeadSuffix))
		if err := os.Remove(filepath.Join(d, journalName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			if s.log != nil {
				s.log.Warn("prune journal", "id", id, "err", err)
			}
			continue
		}
		if s.log != nil {
			s.log.Info("journal pruned", "id", id, "why", why[i])
		}
	}
}
