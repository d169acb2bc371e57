package journal

import (
	"fmt"
	"slices"
	"time"
)

// Retention bounds what a sandbox's journals may keep, so that a
// long-lived sandbox does not fill the disk: the journals of finished
// sessions are pruned, oldest first, while all of the sandbox's journals
// together hold more than MaxBytes, and once a finished session ended
// longer than MaxAge ago. A running session's journal is never pruned. A
// zero field is no bound of that kind.
//
// MaxSessionBytes bounds each session's journal while it runs too: past
// it the oldest output is dropped, down to half of it (Writer.SetCap), and
// an attach says how much was dropped.
type Retention struct {
	MaxBytes        int64         `json:"max_bytes,omitempty"`
	MaxAge          time.Duration `json:"max_age,omitempty"`
	MaxSessionBytes int64         `json:"max_session_bytes,omitempty"`
}

// DefaultRetention is the retention of a sandbox made without one: 1 GiB
// of journals, a week, and 256 MiB of the latest output of each session.
var DefaultRetention = Retention{MaxBytes: 1 << 30, MaxAge: 7 * 24 * time.Hour, MaxSessionBytes: 256 << 20}

// Entry is one session's journal as Retention.Select weighs it.
type Entry struct {
	ID    string
	Size  int64
	Ended time.Time // when the session ended; zero while it runs
}

// Select returns the ids of the journals to prune at now, each with why,
// oldest first.
func (r Retention) Select(entries []Entry, now time.Time) (ids []string, why []string) {
	done := slices.Clone(entries)
	done = slices.DeleteFunc(done, func(e Entry) bool { return e.Ended.IsZero() })
	slices.SortStableFunc(done, func(a, b Entry) int { return a.Ended.Compare(b.Ended) })
	var total int64
	for _, e := range entries {
		total += e.Size
	}
	for _, e := range done {
		switch {
		case r.MaxAge > 0 && now.Sub(e.Ended) > r.MaxAge:
			why = append(why, fmt.Sprintf("it ended %v ago, more than the journals' age limit of %v", now.Sub(e.Ended).Round(time.Second), r.MaxAge))
		case r.MaxBytes > 0 && total > r.MaxBytes:
			why = append(why, fmt.Sprintf("the sandbox's journals held %d bytes, more than their size limit of %d", total, r.MaxBytes))
		default:
			continue
		}
		ids = append(ids, e.ID)
		total -= e.Size
	}
	return ids, why
}
