package jail

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/diskquota"
)

// A sandbox's Spec.DiskBytes bounds its home (mechanism/internal/diskquota),
// and an image sandbox's writable layer alike (below):
// a project quota where the state's file system enforces them and the
// workload is in a user namespace, else, as root, a loop-mounted ext4 image
// of the limit's size in the sandbox's directory, mounted on the home at
// Provision (before anything runs), mounted again by Start after a reboot,
// and unmounted and removed by Destroy (a home given in Spec.HomeDir
// gets what the image holds back under it first). The mount is in the
// host's mount namespace: a manager that restarts, or another one
// adopting the sandbox, finds it in place. disk_quota is guaranteed (and constructed: the
// mechanism makes it, whatever the host's mount options) only where one of
// the two is possible; DiskQuotaMethod says which, or why neither.

// quotaImage is the loop image's name in a sandbox's directory.
const quotaImage = "home.img"

// quotaTemplates is the directory of the state where the loop images'
// templates are kept, one per size (diskquota.Options.Templates): a home's
// image is a copy of its size's, not a run of mkfs.ext4 each. Its name
// starts with a dot: no sandbox's.
const quotaTemplates = ".disk-templates"

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

// applyQuota puts st.Spec.DiskBytes in force on st.HomeDir, a directory
// (what it holds is moved into a loop image), and records it in st.
// Without one, a loop image a Provision cut short left there gives the
// home its files back (a retry may ask for no quota).
func (j *Jail) applyQuota(ctx context.Context, dir string, st *state, uid, gid int) error {
	image := filepath.Join(dir, quotaImage)
	if st.Spec.DiskBytes <= 0 {
		if _, err := os.Lstat(image); err == nil {
			return diskquota.Recover(ctx, st.HomeDir, image)
		}
		return nil
	}
	q, err := j.bound(ctx, st.HomeDir, image, st.Spec.DiskBytes, uid, gid, st.IDBase != 0, true)
	if err != nil {
		return err
	}
	st.Quota = q
	return nil
}

// An image sandbox's writable layer (image.go) takes every write of its
// workload outside its home and /tmp, its whole root for a mapped one
// (userns_image.go). With Spec.DiskBytes it is bounded too, by the same
// means and the same size as the home: layer/ in the sandbox's directory
// holds upper/ and work/ (overlayfs wants both on one file system), and
// is made, mounted again and released with the home. A sandbox's writes
// on the host are then at most twice Spec.DiskBytes: its home and its
// layer. A sandbox provisioned before this (a state without Layer) keeps
// its unbounded upper/ beside its home. One on a copy of its image (no
// overlayfs) has no bound outside its home and needs none: without
// overlayfs it has no idmapped layer, so its workload is not root of its
// root and Landlock lets it write its home, /tmp and /dev/shm alone; the
// copy stays the image's size (TestCopyRootNotWritable).

// layerImage is the layer's loop image in a sandbox's directory.
const layerImage = "layer.img"

// layerDir is the directory of a bounded layer's upper/ and work/.
func layerDir(dir string) string { return filepath.Join(dir, "layer") }

// applyLayerQuota bounds the writable layer of st, an image sandbox with
// Spec.DiskBytes on an overlay, and records it in st; its file system's
// root is the host's root's (provisionImage makes upper/ and work/ in it).
func (j *Jail) applyLayerQuota(ctx context.Context, dir string, st *state) error {
	if st.Spec.DiskBytes <= 0 || st.Spec.Image == nil || imageDirs(dir, st.Spec.Image, false).Copy != "" {
		return nil
	}
	layer := layerDir(dir)
	if err := os.Mkdir(layer, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	q, err := j.bound(ctx, layer, filepath.Join(dir, layerImage), st.Spec.DiskBytes, 0, 0, st.IDBase != 0, false)
	if err != nil {
		return err
	}
	st.Layer = q
	return nil
}

// bound applies a quota of bytes on path, a directory, with its loop
// image (if one) at image and its root owned by uid:gid. A loop quota
// left there by a Provision cut short (no state written: killed, or
// failed where it could not recover it), mounted or not, is undone first:
// with keep, what path held is given back to it (diskquota.Recover: a
// home given in Spec.HomeDir had its files moved into the image, which
// Release would remove with them); without, it is released (a layer
// holds nothing yet).
func (j *Jail) bound(ctx context.Context, path, image string, bytes int64, uid, gid int, userns, keep bool) (*diskquota.Quota, error) {
	if keep {
		if err := diskquota.Recover(ctx, path, image); err != nil {
			return nil, err
		}
	} else if ok, err := diskquota.Mounted(path, image); err != nil {
		return nil, err
	} else if ok {
		stale := &diskquota.Quota{Method: diskquota.Loop, Image: image}
		if err := stale.Release(path); err != nil {
			return nil, err
		}
	}
	q, err := diskquota.Apply(ctx, path, bytes, diskquota.Options{Image: image, UID: uid, GID: gid, UserNS: userns, Templates: filepath.Join(j.cfg.StateDir, quotaTemplates)})
	if err != nil {
		return nil, j.named(err)
	}
	return q, nil
}

// named gives an UnavailableError of diskquota the jail's name.
func (j *Jail) named(err error) error {
	var u *mechanism.UnavailableError
	if errors.As(err, &u) {
		u.Mechanism = j.Name()
	}
	return err
}

// ensureQuota mounts st's home, and its layer, again where a reboot
// unmounted them.
func (j *Jail) ensureQuota(st *state) error {
	if err := st.Quota.Ensure(st.HomeDir); err != nil {
		return j.named(err)
	}
	return j.named(st.Layer.Ensure(layerDir(j.dir(st.ID))))
}

// releaseQuota ends the quotas of sandbox id, stopped, before its
// directory is removed: no mount, loop device or image is left. A home
// given in Spec.HomeDir, which Destroy leaves in place, keeps what its
// loop image holds (copied back under it: diskquota.Recover), as it
// would without a quota; the jail's own home goes with the image.
func (j *Jail) releaseQuota(id string) error {
	dir := j.dir(id)
	st, err := readState(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// A Provision cut short (no state) may have left its quotas in
		// force: its layer holds nothing; its home's image gives the home
		// it was made for (recorded on it) its files back. One that
		// records none (made before images recorded their homes) stays
		// mounted on its home, which keeps its files until unmounted.
		stale := &diskquota.Quota{Method: diskquota.Loop, Image: filepath.Join(dir, layerImage)}
		if ok, _ := diskquota.Mounted(layerDir(dir), stale.Image); ok {
			if err := stale.Release(layerDir(dir)); err != nil {
				return err
			}
		}
		img := filepath.Join(dir, quotaImage)
		if home := diskquota.RecordedHome(img); home != "" {
			return diskquota.Recover(context.Background(), home, img)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if st.Quota != nil && st.Quota.Method == diskquota.Loop && !st.OwnHome {
		if err := diskquota.Recover(context.Background(), st.HomeDir, st.Quota.Image); err != nil {
			return err
		}
	} else if err := st.Quota.Release(st.HomeDir); err != nil {
		return err
	}
	return st.Layer.Release(layerDir(j.dir(id)))
}

// abandonLayer undoes the quotas a Provision that fails put in force in
// dir, its state not written, so that nothing of them is left mounted:
// the layer's is released (it holds nothing yet), and a loop quota on the
// home gives the home back the files it had (a home given in
// Spec.HomeDir had them moved into the image: diskquota.Recover). What
// cannot be undone here a retried Provision undoes (bound).
func (j *Jail) abandonLayer(dir string, st *state) {
	_ = st.Layer.Release(layerDir(dir))
	if st.Quota != nil && st.Quota.Method == diskquota.Loop {
		_ = diskquota.Recover(context.Background(), st.HomeDir, st.Quota.Image)
	}
}

// homeQuota is the quota a sandbox's state records.
type homeQuota = diskquota.Quota
