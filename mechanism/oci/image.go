package oci

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/mountpath"
)

// A sandbox on an image (Spec.Image) gets a bundle whose rootfs is the
// image's root: an overlay of the image's unpacked directory (shared
// read-only by every sandbox on it) under an upper layer of the
// sandbox's own, mounted at <sandbox>/rootfs before the runtime creates
// the container (and again after a reboot or from another mount
// namespace: mountImage is idempotent), unmounted at Destroy. Where the
// kernel has no overlayfs the image is copied there instead. The host's
// runtime binds and /etc entries are left out; the mounts that make the
// sandbox (proc, dev, sys, /tmp, the home) are the same. The workload
// runs as uid 1000 as on the host's root: the image's User is not
// honoured by this mechanism (the jail honours it).

func overlayAvailable() bool {
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(b), "\toverlay\n")
}

// prepareImage makes an image sandbox's rootfs, upper and work
// directories in its directory under construction.
func prepareImage(tmp string, img *mechanism.ImageRoot) error {
	if strings.ContainsAny(img.Dir+tmp, ",:") {
		return mechanism.Invalid("Image.Dir", "overlayfs cannot take a path with ',' or ':'")
	}
	if st, err := os.Stat(img.Dir); err != nil || !st.IsDir() {
		return mechanism.Invalid("Image.Dir", fmt.Sprintf("%s is not an unpacked image root", img.Dir))
	}
	if !overlayAvailable() {
		if out, err := exec.Command("cp", "-a", "--reflink=auto", img.Dir, filepath.Join(tmp, "rootfs")).CombinedOutput(); err != nil {
			return fmt.Errorf("oci: copy the image root: %v: %s", err, out)
		}
		return nil
	}
	for _, d := range []string{"rootfs", "upper", "work"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// mountImage mounts sb's overlay at its rootfs unless it is mounted in
// this mount namespace already, and makes the mount points the bundle
// needs real directories of the tree.
func (m *Mechanism) mountImage(sb *sandbox) error {
	if sb.Spec.Image == nil {
		return nil
	}
	dir := m.dir(sb.ID)
	rootfs := filepath.Join(dir, "rootfs")
	if _, err := os.Stat(filepath.Join(dir, "upper")); err == nil {
		var fs unix.Statfs_t
		if err := unix.Statfs(rootfs, &fs); err != nil {
			return err
		}
		if fs.Type != unix.OVERLAYFS_SUPER_MAGIC {
			opts := "lowerdir=" + sb.Spec.Image.Dir + ",upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
			if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
				return fmt.Errorf("oci: mount the image's overlay: %w", err)
			}
		}
	}
	for _, p := range []string{"/proc", "/dev", "/sys", "/tmp", "/etc", "/home", mechanism.Home, "/.managoat"} {
		if err := mountpath.RealDir(rootfs, p, 0o755, -1); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return err
	}
	if !m.rt.gvisor || runtime.GOARCH != "amd64" {
		return nil
	}
	elf, err := filterExecELF()
	if err != nil {
		return err
	}
	p := filepath.Join(rootfs, filterExecPath)
	_ = os.Remove(p)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o755)
	if err != nil {
		return err
	}
	_, err = f.Write(elf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// unmountImage detaches whatever is mounted at dir's rootfs.
func unmountImage(dir string) {
	for range 8 {
		if unix.Unmount(filepath.Join(dir, "rootfs"), unix.MNT_DETACH) != nil {
			return
		}
	}
}
