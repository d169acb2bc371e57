package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/diskquota"
)

// A sandbox's Spec.DiskBytes bounds its home as in the jail
// (mechanism/internal/diskquota): as root on a state file system without
// project quotas, a loop-mounted ext4 image of the limit's size
// (home.img in the sandbox's directory) mounted on the home before the
// runtime's create binds it into the container, mounted again by a later
// create after a reboot, and released when the sandbox is removed (a
// home given in Spec.HomeDir gets what the image holds back under it
// first). A
// project quota needs the workload in a user namespace of its own, which
// the containers here are not, so the loop device serves. The quota is
// recorded in quota.json next to spec.json.

// quotaSupport caches diskquota.Probe per state directory.
var quotaSupport sync.Map // base dir → diskquota.Support

func (m *Mechanism) diskSupport() diskquota.Support {
	if s, ok := quotaSupport.Load(m.base); ok {
		return s.(diskquota.Support)
	}
	s := diskquota.Probe(m.base, false)
	quotaSupport.Store(m.base, s)
	return s
}

// quotaCaps is disk_quota when this host can enforce it, else nothing.
func (m *Mechanism) quotaCaps() []mechanism.Capability {
	if m.diskSupport().Available() {
		return []mechanism.Capability{mechanism.DiskQuota}
	}
	return nil
}

// DiskQuotaMethod says how a sandbox's Spec.DiskBytes is enforced on this
// host ("project" or "loop") with the reason, or "" and why it cannot be.
func (m *Mechanism) DiskQuotaMethod() (method, detail string) {
	s := m.diskSupport()
	return string(s.Method), s.Detail
}

// homeQuota is quota.json: the quota and the home it is on.
type homeQuota struct {
	Home  string           `json:"home"`
	Quota *diskquota.Quota `json:"quota"`
}

func (m *Mechanism) quotaFile(id string) string { return filepath.Join(m.dir(id), "quota.json") }

func (m *Mechanism) loadQuota(id string) (*homeQuota, error) {
	b, err := os.ReadFile(m.quotaFile(id))
	if err != nil {
		return nil, err
	}
	var q homeQuota
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("oci: %s: %w", m.quotaFile(id), err)
	}
	return &q, nil
}

// mountHome puts sb.Spec.DiskBytes in force on sb.HomeDir before the
// runtime binds it: the first time it applies it, later it mounts it again
// where a reboot unmounted it.
func (m *Mechanism) mountHome(ctx context.Context, sb *sandbox) error {
	if sb.Spec.DiskBytes <= 0 {
		return nil
	}
	q, err := m.loadQuota(sb.ID)
	if err == nil {
		return named(m, q.Quota.Ensure(q.Home))
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// A create cut short before it wrote quota.json (killed, or a reboot
	// since) left the home's files in its image, mounted or not: they are
	// given back to the home (diskquota.Recover), not removed with it.
	image := filepath.Join(m.dir(sb.ID), "home.img")
	if err := diskquota.Recover(ctx, sb.HomeDir, image); err != nil {
		return named(m, err)
	}
	dq, err := diskquota.Apply(ctx, sb.HomeDir, sb.Spec.DiskBytes, diskquota.Options{Image: image, UID: UID, GID: GID})
	if err != nil {
		return named(m, err)
	}
	b, _ := json.Marshal(homeQuota{Home: sb.HomeDir, Quota: dq})
	if err := os.WriteFile(m.quotaFile(sb.ID), b, 0o600); err != nil {
		if rerr := diskquota.Recover(context.WithoutCancel(ctx), sb.HomeDir, image); rerr != nil {
			return fmt.Errorf("oci: %s: %w; and giving the home its files back: %v", m.quotaFile(sb.ID), err, rerr)
		}
		return err
	}
	return nil
}

// ensureHome mounts sandbox id's home again where a reboot unmounted it
// (nothing without a quota).
func (m *Mechanism) ensureHome(id string) error {
	q, err := m.loadQuota(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return named(m, q.Quota.Ensure(q.Home))
}

// releaseHome ends the quota of sandbox id, whose container is gone,
// before its directory is removed. A home given in Spec.HomeDir, which
// stays, keeps what its loop image holds (copied back under it:
// diskquota.Recover), as it would without a quota; the sandbox's own
// home goes with the image.
func (m *Mechanism) releaseHome(id string) error {
	q, err := m.loadQuota(id)
	if errors.Is(err, fs.ErrNotExist) {
		// A create cut short before it wrote quota.json may have left the
		// home's image mounted: the home it records gets its files back.
		image := filepath.Join(m.dir(id), "home.img")
		if home := diskquota.RecordedHome(image); home != "" {
			return named(m, diskquota.Recover(context.Background(), home, image))
		}
		return nil
	}
	if err != nil {
		return err
	}
	own := filepath.Clean(q.Home) == filepath.Join(m.dir(id), "home")
	if q.Quota != nil && q.Quota.Method == diskquota.Loop && !own {
		if err := diskquota.Recover(context.Background(), q.Home, q.Quota.Image); err != nil {
			return named(m, err)
		}
	} else if err := q.Quota.Release(q.Home); err != nil {
		return err
	}
	return os.Remove(m.quotaFile(id))
}

// named makes a diskquota refusal name this mechanism.
func named(m *Mechanism, err error) error {
	var u *mechanism.UnavailableError
	if errors.As(err, &u) {
		u.Mechanism = m.Name()
	}
	return err
}
