package jail

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/diskquota"
)

// A sandbox's Spec.DiskBytes bounds its home (mechanism/internal/diskquota):
// a project quota where the state's file system enforces them and the
// workload is in a user namespace, else, as root, a loop-mounted ext4 image
// of the limit's size in the sandbox's directory, mounted on the home at
// Provision (before anything runs), mounted again by Start after a reboot,
// and unmounted and removed by Destroy. The mount is in the host's mount
// namespace: a manager that restarts, or another one adopting the sandbox,
// finds it in place. disk_quota is guaranteed (and constructed: the
// mechanism makes it, whatever the host's mount options) only where one of
// the two is possible; DiskQuotaMethod says which, or why neither.

// quotaImage is the loop image's name in a sandbox's directory.
const quotaImage = "home.img"

// quotaSupport caches diskquota.Probe per state directory: every
// capability question asks it, and the answer is a few system calls.
var quotaSupport sync.Map // state dir → diskquota.Support

func (j *Jail) diskSupport() diskquota.Support {
	if s, ok := quotaSupport.Load(j.cfg.StateDir); ok {
		return s.(diskquota.Support)
	}
	s := diskquota.Probe(j.cfg.StateDir, j.quotaUserNS())
	quotaSupport.Store(j.cfg.StateDir, s)
	return s
}

// quotaUserNS says whether this jail's sandboxes run in a user namespace
// of their own (userns.go), where the workload cannot move its files out
// of a project quota; a sandbox that has none (no uid range: IDBase 0)
// gets a loop device all the same (applyQuota).
func (j *Jail) quotaUserNS() bool { return j.usernsSupport() == nil }

// quotaCaps is disk_quota when this host can enforce it, else nothing.
func (j *Jail) quotaCaps() []mechanism.Capability {
	if j.diskSupport().Available() {
		return []mechanism.Capability{mechanism.DiskQuota}
	}
	return nil
}

// DiskQuotaMethod says how a sandbox's Spec.DiskBytes is enforced on this
// host ("project" or "loop") with the reason, or "" and why it cannot be.
func (j *Jail) DiskQuotaMethod() (method, detail string) {
	s := j.diskSupport()
	return string(s.Method), s.Detail
}

// VerifyDiskQuota does what a sandbox's home gets, once, in a throwaway
// directory of the state (diskquota.Verify): a 1 MiB limit and a 2 MiB
// write that must fail. The doctor runs it.
func (j *Jail) VerifyDiskQuota(ctx context.Context) (method, detail string) {
	s := diskquota.Verify(ctx, j.cfg.StateDir, j.quotaUserNS())
	return string(s.Method), s.Detail
}

// applyQuota puts st.Spec.DiskBytes in force on st.HomeDir, an empty
// directory, and records it in st. A home left mounted by a Provision cut
// short (no state written) is released first.
func (j *Jail) applyQuota(ctx context.Context, dir string, st *state, uid, gid int) error {
	if st.Spec.DiskBytes <= 0 {
		return nil
	}
	image := filepath.Join(dir, quotaImage)
	if ok, err := diskquota.Mounted(st.HomeDir, image); err != nil {
		return err
	} else if ok {
		stale := &diskquota.Quota{Method: diskquota.Loop, Image: image}
		if err := stale.Release(st.HomeDir); err != nil {
			return err
		}
	}
	q, err := diskquota.Apply(ctx, st.HomeDir, st.Spec.DiskBytes, diskquota.Options{Image: image, UID: uid, GID: gid, UserNS: st.IDBase != 0})
	if err != nil {
		var u *mechanism.UnavailableError
		if errors.As(err, &u) {
			u.Mechanism = j.Name()
		}
		return err
	}
	st.Quota = q
	return nil
}

// ensureQuota mounts st's home again where a reboot unmounted it.
func (j *Jail) ensureQuota(st *state) error {
	if err := st.Quota.Ensure(st.HomeDir); err != nil {
		var u *mechanism.UnavailableError
		if errors.As(err, &u) {
			u.Mechanism = j.Name()
		}
		return err
	}
	return nil
}

// releaseQuota ends the quota of sandbox id, stopped, before its
// directory is removed: no mount, loop device or image is left.
func (j *Jail) releaseQuota(id string) error {
	st, err := readState(j.dir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return st.Quota.Release(st.HomeDir)
}

// homeQuota is the quota a sandbox's state records.
type homeQuota = diskquota.Quota
