package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/mountpath"
)

// Host mounts (Spec.Mounts) are bind mounts of the bundle: rbind, nosuid,
// nodev, private propagation, and for :ro read-only ("ro", and on runc
// also "rro": the read-only flag on every submount of the source too,
// which runc sets with mount_setattr). Provision resolves each source's
// symbolic links once and keeps the result in the bundle and spec.json.
//
// The runtime makes a missing mount point itself, resolving symbolic
// links inside the container's root (runc's securejoin): a link to / the
// workload left on a target's path in its home would move the mount onto
// the container's root. So before every create the mechanism walks each
// target itself, with no symbolic link followed (package mountpath), and
// makes what is missing: in the home beneath Home; in the rootfs skeleton
// (one per host layout and set of mount points, read-only in every
// container, so no sandbox's mount point shows in another's root) for a
// target elsewhere; beneath a read-only bind of the host (/usr, /etc/ssl)
// it must exist on the host. A target beneath /tmp is on the container's
// fresh tmpfs, and the runtime makes it. A link found is an error at
// create (or start), naming it.

// bindOptions are the bundle options of m on runtime rt.
func bindOptions(m mechanism.Mount, rt runtimeInfo) []string {
	opts := []string{"rbind", "rprivate", "nosuid", "nodev"}
	if m.ReadOnly {
		opts = append(opts, "ro")
		if !rt.gvisor {
			opts = append(opts, "rro")
		}
	}
	return opts
}

// hostMounts are the bundle's mounts of spec.Mounts (they go last: on top
// of the home and /tmp).
func hostMounts(spec mechanism.Spec, rt runtimeInfo) []ociMount {
	var out []ociMount
	for _, m := range spec.Mounts {
		out = append(out, ociMount{Destination: m.Target, Type: "bind", Source: m.Source, Options: bindOptions(m, rt)})
	}
	return out
}

// beneathBind returns the host path of target when it is beneath one of
// the host's trees the root binds read-only (h), else "".
func beneathBind(target string, h hostLayout) string {
	for _, d := range h.Dirs {
		if strings.HasPrefix(target, d+"/") {
			return target
		}
	}
	for _, name := range append(slices.Clone(h.EtcDirs), h.EtcFiles...) {
		if p := "/etc/" + name; target == p || strings.HasPrefix(target, p+"/") {
			return target
		}
	}
	return ""
}

// rootPoints are the targets of spec whose mount point is in the rootfs
// skeleton itself (not beneath the home, /tmp or a bind of the host),
// with whether each is a directory, sorted.
func rootPoints(spec mechanism.Spec, h hostLayout) ([]string, error) {
	var pts []string
	for _, m := range spec.Mounts {
		if strings.HasPrefix(m.Target, mechanism.Home+"/") || strings.HasPrefix(m.Target, "/tmp/") || beneathBind(m.Target, h) != "" {
			continue
		}
		fd, err := mountpath.OpenSource(m.Source)
		if err != nil {
			return nil, err
		}
		dir, err := mountpath.IsDir(fd)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		kind := "f"
		if dir {
			kind = "d"
		}
		pts = append(pts, kind+m.Target)
	}
	slices.Sort(pts)
	return pts, nil
}

// rootfsFor is rootfs for a sandbox of spec: the shared skeleton, or,
// when spec's mounts need mount points in it, a skeleton with them (one
// per set of points, shared by every sandbox that needs the same).
func (m *Mechanism) rootfsFor(h hostLayout, spec mechanism.Spec) (string, error) {
	pts, err := rootPoints(spec, h)
	if err != nil || len(pts) == 0 {
		if err != nil {
			return "", err
		}
		return m.rootfs(h)
	}
	sum := sha256.Sum256([]byte(strings.Join(pts, "\x00")))
	dir := filepath.Join(m.base, "rootfs-"+h.key()+"-m"+hex.EncodeToString(sum[:6]))
	m.rootfsMu.Lock()
	defer m.rootfsMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(m.base, "tmp"), "rootfs-")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := buildRootfs(tmp, h); err != nil {
		return fail(fmt.Errorf("oci: build rootfs: %w", err))
	}
	rfd, err := unix.Open(tmp, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	for _, p := range pts {
		fd, err := mountpath.Walk(rfd, p[1:], p[0] == 'd', true, p[1:])
		if err != nil {
			unix.Close(rfd)
			return fail(err)
		}
		unix.Close(fd)
	}
	unix.Close(rfd)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr == nil {
			return dir, nil // another process built it
		}
		return "", err
	}
	return dir, nil
}

// prepareMounts, before each create, checks every mount: its source has
// no symbolic link on its path (a swap since Provision), and its target
// is reached without one, made where it is missing in the home.
func (m *Mechanism) prepareMounts(sb *sandbox) error {
	if len(sb.Spec.Mounts) == 0 {
		return nil
	}
	h := scanHost()
	for _, mt := range sb.Spec.Mounts {
		fd, err := mountpath.OpenSource(mt.Source)
		if err != nil {
			return err
		}
		dir, err := mountpath.IsDir(fd)
		unix.Close(fd)
		if err != nil {
			return err
		}
		var root, rel string
		mk := false
		switch {
		case strings.HasPrefix(mt.Target, mechanism.Home+"/"):
			root, rel, mk = sb.HomeDir, strings.TrimPrefix(mt.Target, mechanism.Home), true
		case strings.HasPrefix(mt.Target, "/tmp/"):
			continue // the container's own fresh tmpfs
		case sb.Spec.Image != nil:
			root, rel, mk = filepath.Join(m.dir(sb.ID), "rootfs"), mt.Target, true
		case beneathBind(mt.Target, h) != "":
			root, rel = "/", mt.Target // the host's own tree, bound read-only
		default:
			continue // made in the skeleton (rootfsFor)
		}
		rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fd, err = mountpath.Walk(rfd, path.Clean("/"+rel), dir, mk, mt.Target)
		unix.Close(rfd)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
}
