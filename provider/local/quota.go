package local

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// A sandbox's home is bounded (sandbox.Limits.DiskBytes, managoat's
// --disk) where its mechanism guarantees disk_quota: the jail and the OCI
// runtimes as root, with a project quota where the state's file system
// enforces them for the workload, else a loop-mounted ext4 image of the
// limit's size (mechanism/internal/diskquota). Elsewhere (trusted, a jail
// without root) a create that asks for one is refused.
//
// A sandbox made without one gets DefaultDiskBytes (10 GiB, at most a
// quarter of the state's file system) where that is cheap: with project
// quotas (two system calls). A loop-mounted home's image is a copy of an
// empty one the jail keeps per size (no mkfs per sandbox), yet its mount,
// its unmount (which flushes through the loop device into the host's
// disk) and its image's removal still cost a cold start (create, exec
// true, destroy) 1.9 times the time without one on a quiet 2-core VM
// (medians of 26 ms against 14 ms), 3 to 4.5 times with the host's disk
// busy (`go test -run XXX -bench ColdStartDiskQuota ./provider/local/`).
// So on a host without project quotas homes are unbounded by default
// unless the operator asks for the default with $MANAGOAT_DEFAULT_DISK
// (or Config.DefaultLimits), which then applies with a loop device too;
// DefaultDiskQuota says which, and `managoat doctor` shows it.

// EnvDefaultDisk sets the default home quota (DefaultLimits().DiskBytes):
// a size such as 10G, or 0 for none.
const EnvDefaultDisk = "MANAGOAT_DEFAULT_DISK"

// defaultDiskBytes is the default home quota without EnvDefaultDisk.
const defaultDiskBytes = 10 << 30

// DefaultDiskBytes is the home quota of a sandbox whose create sets none
// ($MANAGOAT_DEFAULT_DISK, else 10 GiB; 0 when the variable says 0 or
// cannot be read as a size). Without the variable it applies only where
// it is cheap (see defaultDisk).
func DefaultDiskBytes() int64 {
	v, ok := os.LookupEnv(EnvDefaultDisk)
	if !ok || v == "" {
		return defaultDiskBytes
	}
	return parseBytes(v)
}

// parseBytes reads 0, 1024, 512M, 10G (powers of 1024; a trailing B or
// iB is accepted); anything else is 0.
func parseBytes(s string) int64 {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		if i := strings.IndexByte("KMGT", t[n-1]); i >= 0 {
			mult, t = int64(1)<<(10*(i+1)), t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || v*float64(mult) > 1<<50 {
		return 0
	}
	return int64(v * float64(mult))
}

// diskQuotaMethoder is what the jail and the OCI mechanism say of their
// home quotas on this host.
type diskQuotaMethoder interface {
	DiskQuotaMethod() (method, detail string)
}

// DiskQuotaMethod says how the homes of m's sandboxes are bounded here
// ("project" or "loop", with the reason), or "" and why they cannot be.
func DiskQuotaMethod(m mechanism.Mechanism) (method, detail string) {
	if q, ok := m.(diskQuotaMethoder); ok {
		method, detail = q.DiskQuotaMethod()
		if method != "" && !slices.Contains(mechanism.Guaranteed(m), mechanism.DiskQuota) {
			return "", m.Name() + " does not guarantee disk_quota"
		}
		return method, detail
	}
	return "", "mechanism " + m.Name() + " applies no disk quota"
}

// defaultDisk is the default home quota of p's sandboxes and why: want,
// where the mechanism guarantees disk_quota with project quotas, or with a
// loop device when explicit (the operator asked: $MANAGOAT_DEFAULT_DISK or
// Config.DefaultLimits), at most a quarter of the state's file system; 0
// elsewhere.
func defaultDisk(m mechanism.Mechanism, state string, want int64, explicit bool) (int64, string) {
	method, why := DiskQuotaMethod(m)
	switch {
	case want <= 0:
		return 0, "turned off (" + EnvDefaultDisk + "=0 or Config.DefaultLimits)"
	case method == "":
		return 0, why
	case method != "project" && !explicit:
		return 0, "not by default with a " + method + " device: it costs a sandbox's cold start 2 to 4 times (BenchmarkColdStartDiskQuota); " + EnvDefaultDisk + "=SIZE asks for it, --disk sets one"
	}
	var fs unix.Statfs_t
	if unix.Statfs(state, &fs) == nil {
		if q := int64(fs.Blocks) * fs.Bsize / 4; q > 0 && q < want {
			want = q
		}
	}
	return want, method
}

// DefaultDiskQuota is the home quota a sandbox of p gets when its create
// sets none (0 for none) and how it is enforced, or why there is none.
func (p *Provider) DefaultDiskQuota() (bytes int64, how string) {
	return p.defaults.DiskBytes, p.diskWhy
}

// diskUse adds to a sandbox's raw info what its home holds, when the home
// is a file system of its own (a loop-mounted quota: statfs answers at
// once; a walk of the home would not).
func diskUse(home string, raw map[string]any) {
	var h, p unix.Stat_t
	if unix.Stat(home, &h) != nil || unix.Stat(filepath.Dir(home), &p) != nil || h.Dev == p.Dev {
		return
	}
	var fs unix.Statfs_t
	if unix.Statfs(home, &fs) == nil {
		raw["disk_used_bytes"] = int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}
}
