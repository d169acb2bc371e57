package runner

import (
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Bounds of the runner host. Everything a frame says is the platform's,
// and past the platform whoever reached it: the daemon checks it before
// it becomes a duration, a size or work.
//
//   - Durations in milliseconds (create's wall_clock_ms, exec's and
//     terminate_session's timeout_ms) are at most MaxDurationMS (about 292
//     years, what a time.Duration holds): a larger one is Invalid, never
//     wrapped around to a negative or a zero that reads "no limit".
//   - A create's cpu_millis is at most MaxCPUMillis and pids at most
//     MaxPids (Linux's own pid_max bound).
//   - A create's disk_bytes is at most Config.DiskShare (default one half)
//     of the space free to unprivileged users on the file system of the
//     homes (statfs of the provider's state directory, else Config.Root),
//     as the create asks: a larger one is Invalid{disk} naming both
//     figures. Homes are sparse images or project quotas, so the rule is
//     per create against what is free then, not a sum of what was granted.
//   - A create without disk_bytes gets Config.DefaultDiskBytes when it is
//     positive, lowered to the share of the free space when it is larger
//     (the provider refuses it where it cannot bound a home). Zero or
//     negative adds none: the provider's own default stands
//     (provider/local gives DefaultDiskBytes, 10 GiB, where project quotas
//     make it cheap, and with a loop device too under
//     $MANAGOAT_DEFAULT_DISK). A daemon's home quota by default is the
//     operator's to set (a loop-mounted home, made from a kept empty
//     ext4 image since dbc5cfb, costs a cold start about 1.9 times on a
//     quiet host and 3 to 4.5 times with the host's disk busy,
//     BenchmarkColdStartDiskQuota in provider/local's quota.go).
//   - Frames: at most Config.MaxOpsPerConn (default 64) requests of a
//     connection are served at once (stdin queued behind its session's
//     earlier stdin counts too); when all are taken the daemon stops
//     reading the socket (the platform's writes wait in TCP) for up to
//     Config.BusyWait (default 1 s: the socket's keep-alive pings are read
//     by the same loop), then answers the request rate_limited (retry
//     after 1 s) without serving it.
//   - Files: at most Config.MaxFileOps (default 2) read_file and
//     write_file are under way at once on the daemon: a write_file's
//     place is taken before its frame is served, as for the frames above
//     (its frame is large), a read_file waits for one in its own
//     goroutine (it holds nothing large while it waits). A read is
//     stat'ed first
//     (a file over wire.MaxWriteFile is file_too_large before a byte is
//     read) and base64-encoded straight from the file into its reply
//     frame, whose buffers are reused: three concurrent reads of a 1 GB
//     file used to take the daemon from 28 MB to 2.5–3 GB.

// DefaultDiskShare is Config.DiskShare's default.
const DefaultDiskShare = 0.5

// MaxDurationMS is the largest duration in milliseconds a frame may carry.
const MaxDurationMS = math.MaxInt64 / int64(time.Millisecond)

// MaxCPUMillis and MaxPids bound a create's cpu_millis and pids.
const (
	MaxCPUMillis = 1 << 20 // 1048 CPUs
	MaxPids      = 1 << 22 // Linux's PID_MAX_LIMIT
)

// msDuration is ms milliseconds, or Invalid{field} when it is negative or
// more than a time.Duration holds.
func msDuration(field string, ms int64) (time.Duration, error) {
	if ms < 0 || ms > MaxDurationMS {
		return 0, sandbox.Invalid(field, fmt.Sprintf("%d ms is outside 0..%d", ms, MaxDurationMS))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// limitsOf checks a create's limits field and makes it sandbox.Limits.
func limitsOf(l *wire.Limits) (sandbox.Limits, error) {
	wc, err := msDuration("wall_clock_ms", l.WallClockMS)
	if err != nil {
		return sandbox.Limits{}, err
	}
	lim := sandbox.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUMillis: l.CPUMillis, WallClock: wc, DiskBytes: l.DiskBytes}
	if err := lim.Validate(); err != nil {
		return sandbox.Limits{}, err
	}
	if l.CPUMillis > MaxCPUMillis {
		return sandbox.Limits{}, sandbox.Invalid("cpu_millis", fmt.Sprintf("%d is more than %d", l.CPUMillis, MaxCPUMillis))
	}
	if l.Pids > MaxPids {
		return sandbox.Limits{}, sandbox.Invalid("pids", fmt.Sprintf("%d is more than %d", l.Pids, MaxPids))
	}
	return lim, nil
}

// homesDir is the directory whose file system holds the homes.
func (d *Daemon) homesDir() string {
	if s, ok := d.p.(interface{ StateDir() string }); ok && s.StateDir() != "" {
		return s.StateDir()
	}
	return d.cfg.Root
}

// freeBytes is the space free to unprivileged users where the homes are.
func (d *Daemon) freeBytes() (int64, error) {
	dir := d.homesDir()
	if dir == "" {
		return 0, fmt.Errorf("no state directory to measure")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return int64(fs.Bavail) * fs.Bsize, nil
}

// defaultDisk is the home quota of a create that asks none (0: none).
func (d *Daemon) defaultDisk() int64 { return max(d.cfg.DefaultDiskBytes, 0) }

// diskFor applies the disk rules to a create's limits.
func (d *Daemon) diskFor(lim *sandbox.Limits) error {
	asked := lim.DiskBytes
	def := int64(0)
	if asked == 0 {
		def = d.defaultDisk()
		if def == 0 {
			return nil
		}
	}
	free, err := d.freeBytes()
	if err != nil {
		if asked == 0 {
			return nil // the default is a safety net; nothing to size it by
		}
		return sandbox.Unavailable("disk_space", fmt.Errorf("measuring the free space of the homes: %w", err))
	}
	share := d.cfg.DiskShare
	allowed := int64(float64(free) * share)
	if asked > 0 {
		if asked > allowed {
			return sandbox.Invalid("disk", fmt.Sprintf("%d bytes asked, more than %g of the %d bytes free on this runner's host (%d)", asked, share, free, allowed))
		}
		return nil
	}
	lim.DiskBytes = min(def, allowed)
	if lim.DiskBytes <= 0 {
		lim.DiskBytes = 0
	}
	return nil
}

// readFileReply reads a file through fo into a read_file reply frame for
// request id: {"id":..,"ok":true,"result":{"data":"<base64>"}}, encoded
// straight from the file into buf (reused; grown to the frame's size).
func readFileReply(buf []byte, id int64, r io.Reader, size int64) ([]byte, error) {
	prefix := `{"id":` + strconv.FormatInt(id, 10) + `,"ok":true,"result":{"data":"`
	const suffix = `"}}`
	need := len(prefix) + base64.StdEncoding.EncodedLen(int(size)) + len(suffix)
	if cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	buf = append(buf[:0], prefix...)
	enc := base64.NewEncoder(base64.StdEncoding, appender{&buf})
	chunk := make([]byte, 48<<10) // a multiple of 3: no carry between writes
	var n int64
	for n < size {
		k, err := io.ReadFull(r, chunk[:min(int64(len(chunk)), size-n)])
		if k > 0 {
			_, _ = enc.Write(chunk[:k])
			n += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break // shrank while read: what there was
		}
		if err != nil {
			return buf, err
		}
	}
	_ = enc.Close()
	return append(buf, suffix...), nil
}

type appender struct{ b *[]byte }

func (a appender) Write(p []byte) (int, error) { *a.b = append(*a.b, p...); return len(p), nil }
