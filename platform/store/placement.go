package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Runner scheduling states (RunnerSchedule.State): "" takes new sandboxes.
const (
	ScheduleCordoned = "cordoned" // no new sandbox is placed on the runner
	ScheduleDraining = "draining" // cordoned, and its sandboxes are being parked or waited for
)

// RunnerSchedule is what an account's operator set on one of its runners
// (managoat runners cordon, drain, uncordon, label): it is kept by
// runner id, so it holds across the runner's reconnections, the
// platform's restarts and every replica. Labels are the operator's (set
// at enrolment or later); they add to the daemon's own and win over them.
type RunnerSchedule struct {
	AccountID string
	RunnerID  string
	Name      string // the runner's name when it was set, for display
	State     string // "", ScheduleCordoned or ScheduleDraining
	Labels    map[string]string
	UpdatedAt time.Time
}

// Room bounds what a runner may hold: an insert through
// InsertSandboxWithin is refused when the records already on the runner
// (those of Provider whose UsageKey is Prefix: runner-<id>-<suffix> for
// runner-<id>-) and the new one together pass a bound. Zero is no bound.
type Room struct {
	Provider    string
	Prefix      string
	MemoryBytes int64
	CPUMillis   int64
	DiskBytes   int64
	Sandboxes   int64
}

// UsageKeyChars are the bytes UsageKey trims from the end of a name.
const UsageKeyChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._"

// UsageKey is the prefix a record's provider name is counted under: the
// name up to and including its last '-' (any byte not in UsageKeyChars),
// "" (not counted) when it has none. The stores keep a counter per
// provider and key, updated with every write of a record in the same
// transaction (triggers), so what a runner holds is one row to read.
func UsageKey(providerName string) string {
	return strings.TrimRight(providerName, UsageKeyChars)
}

// Usage is what the records on one runner ask together. A record parked
// by destroy is not counted: its sandbox is gone from the runner until it
// wakes.
type Usage struct {
	MemoryBytes int64
	CPUMillis   int64
	DiskBytes   int64
	Sandboxes   int64
}

// NoRoomError is InsertSandboxWithin's refusal: Resource (memory, cpu,
// disk, sandboxes) would pass its bound. errors.Is(err, ErrNoRoom).
type NoRoomError struct {
	Resource              string
	Used, Asked, Capacity int64
}

// ErrNoRoom matches every *NoRoomError.
var ErrNoRoom = errors.New("store: no room on the runner")

func (e *NoRoomError) Error() string {
	return fmt.Sprintf("%s: %d in use + %d asked > %d", e.Resource, e.Used, e.Asked, e.Capacity)
}

// Is makes errors.Is(err, ErrNoRoom) hold.
func (e *NoRoomError) Is(target error) bool { return target == ErrNoRoom }

// Fits checks u plus s's limits (and one more sandbox) against r; nil, or
// the first bound passed.
func (r Room) Fits(u Usage, s Sandbox) error {
	for _, c := range []struct {
		what             string
		used, asked, cap int64
	}{
		{"memory", u.MemoryBytes, s.Limits.MemoryBytes, r.MemoryBytes},
		{"cpu", u.CPUMillis, int64(s.Limits.CPUMillis), r.CPUMillis},
		{"disk", u.DiskBytes, s.Limits.DiskBytes, r.DiskBytes},
		{"sandboxes", u.Sandboxes, 1, r.Sandboxes},
	} {
		if c.cap > 0 && c.asked > 0 && c.used+c.asked > c.cap {
			return &NoRoomError{Resource: c.what, Used: c.used, Asked: c.asked, Capacity: c.cap}
		}
	}
	return nil
}

// Placer is the part of Store that placement on runners uses.
type Placer interface {
	// InsertSandboxWithin inserts s as InsertSandbox does, only when the
	// records within r (and s) fit r's bounds, else a *NoRoomError; s's
	// UsageKey must be r.Prefix. The read of the room's counter and the
	// insert are one transaction under a lock of the prefix, so two
	// inserts on one runner, from any replica, never pass a bound
	// together.
	InsertSandboxWithin(ctx context.Context, s Sandbox, r Room) error
	// UsageOf is what the records of provider whose UsageKey is prefix
	// ask together (their counter: one row, not a sum of the records).
	UsageOf(ctx context.Context, provider, prefix string) (Usage, error)
	// Usages is UsageOf for each of prefixes at once; a prefix that holds
	// nothing is absent.
	Usages(ctx context.Context, provider string, prefixes []string) (map[string]Usage, error)
	// CountSandboxes is how many records the account holds (its quota's
	// count), without reading them.
	CountSandboxes(ctx context.Context, accountID string) (int, error)
	// SetRunnerSchedule records sch over any earlier one of its runner.
	SetRunnerSchedule(ctx context.Context, sch RunnerSchedule) error
	// RunnerSchedules lists an account's, by runner id.
	RunnerSchedules(ctx context.Context, accountID string) ([]RunnerSchedule, error)
}
