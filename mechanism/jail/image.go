package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/etcfiles"
	"github.com/managoat/managoat/mechanism/internal/mountpath"
)

// A sandbox on an image (Spec.Image) runs on the image's unpacked root
// instead of the host's runtime. Its root is an overlay: the image's
// directory, shared read-only by every sandbox on it, under an upper
// layer of the sandbox's own (upper/ and work/ in its state directory),
// so whatever the sandbox writes outside its home stays its own and the
// image is stored once however many sandboxes use it. With
// Spec.DiskBytes the layer is bounded like the home, by the same means
// and the same size (quota.go): upper/ and work/ are then in layer/, a
// file system of its own. Where the kernel
// has no overlayfs, Provision copies the image into the sandbox's
// directory instead (cp -a --reflink=auto: reflinks where the file
// system has them) and that copy is bound as the root. The workload
// cannot write that copy (it has no idmapped layer without overlayfs,
// and writes, as on the host's root, only its home and /tmp): it stays
// the image's size, and Spec.DiskBytes does not bound it.
//
// On top come the same mounts as on the host's root: the home at
// /home/sprite, a fresh /dev, a private /tmp, /dev/shm, /dev/pts and
// /proc. The image's /etc is kept (its passwd names its users) but for
// hosts, hostname and resolv.conf, which are the sandbox's. Every mount
// point is made a real directory first: a symlink the image has there
// (an absolute one would point at the host's tree while the root is
// built) is replaced in the upper layer, never followed.
//
// The workload runs as the image's user when that user is not root
// (Spec.Image.UID), else as the jail's (1000); the Landlock ruleset,
// seccomp filter and capabilities are the same as on the host's root.
// With a uid range of its own and an idmapped image layer (Mapped,
// userns_image.go) the image's user is taken as it is, root included,
// and the workload may write its whole root (the upper layer takes it).

// imageLaunch is what the tree builder needs of an image sandbox.
type imageLaunch struct {
	Lower string // the image's unpacked root (read-only)
	Upper string // the sandbox's writable layer
	Work  string // overlayfs's work directory, beside Upper
	Copy  string // the sandbox's own copy, where there is no overlayfs
	// Mapped: the lower layer is mounted idmapped with the sandbox's
	// user namespace, at LowerMount, under the overlay (userns_image.go).
	Mapped     bool   `json:",omitempty"`
	LowerMount string `json:",omitempty"`
}

var overlayOnce = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(b), "\toverlay\n")
})

// imageDirs returns the launch directories of an image sandbox whose
// state is in dir; with layered (a bounded layer, quota.go) its upper
// and work directories are in layerDir(dir), one file system.
func imageDirs(dir string, img *mechanism.ImageRoot, layered bool) *imageLaunch {
	if img == nil {
		return nil
	}
	rw := dir
	if layered {
		rw = layerDir(dir)
	}
	il := &imageLaunch{Lower: img.Dir, Upper: filepath.Join(rw, "upper"), Work: filepath.Join(rw, "work"), LowerMount: filepath.Join(dir, "lower")}
	if !overlayOnce() {
		il.Copy = filepath.Join(dir, "rootfs")
	}
	return il
}

// provisionImage makes an image sandbox's writable layer (or its copy of
// the image), in its bounded file system with layered (mounted on
// layerDir(dir) before); with mapped, the upper layer's root is owned by
// the sandbox's root (host id base), and the idmapped layer's mount
// point is made.
func provisionImage(dir string, img *mechanism.ImageRoot, base int, mapped, layered bool) error {
	il := imageDirs(dir, img, layered)
	if il == nil {
		return nil
	}
	if strings.ContainsAny(il.Lower+il.Upper+il.Work+il.LowerMount, ",:") {
		return mechanism.Invalid("Image.Dir", "overlayfs cannot take a path with ',' or ':'")
	}
	if st, err := os.Stat(il.Lower); err != nil || !st.IsDir() {
		return mechanism.Invalid("Image.Dir", fmt.Sprintf("%s is not an unpacked image root", il.Lower))
	}
	if il.Copy != "" {
		if _, err := os.Stat(il.Copy); err == nil {
			return nil
		}
		tmp := il.Copy + ".tmp"
		os.RemoveAll(tmp)
		if out, err := exec.Command("cp", "-a", "--reflink=auto", il.Lower, tmp).CombinedOutput(); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("copy the image root: %v: %s", err, out)
		}
		return os.Rename(tmp, il.Copy)
	}
	for _, d := range []string{il.Upper, il.Work, il.LowerMount} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
	}
	if mapped {
		return os.Chown(il.Upper, base, base)
	}
	return nil
}

// buildImageBeside is buildBeside for an image sandbox: no template (the
// root is the sandbox's own overlay). A mapped one's image layer is
// idmapped with the user namespace made for it beforehand (up; a C init
// joins that one, the Go init is born in one with the same mapping).
func buildImageBeside(mnt, uts int, lc launchConfig, up *usernsPrep) error {
	for _, fd := range []int{mnt, uts} {
		if err := unix.Setns(fd, 0); err != nil {
			return fmt.Errorf("join the sandbox's namespaces: %w", err)
		}
	}
	switch {
	case lc.Image.Mapped && up != nil:
		ns, err := up.wait()
		if err != nil {
			return fmt.Errorf("the sandbox's user namespace: %w", err)
		}
		if err := buildImageTree(lc, ns); err != nil {
			return err
		}
	case lc.Image.Mapped:
		return errors.New("internal: no user namespace for a mapped image's layer")
	default:
		if err := buildImageTree(lc, -1); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(lc.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return nil
}

// buildImageTree is buildTreeBase for an image sandbox: the overlay (or
// the copy) at cfg.Root, the mount points, the sandbox's /etc files, /dev
// and the home. With usernsFD (a mapped sandbox's) the image layer is
// mounted idmapped under the overlay, and what is made in the upper
// layer is owned by the sandbox's root.
func buildImageTree(cfg launchConfig, usernsFD int) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	r, il := cfg.Root, cfg.Image
	own := -1
	if usernsFD >= 0 {
		own = cfg.IDBase
	}
	if il.Copy != "" {
		if err := mount(il.Copy, r, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := mount("", r, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return err
		}
	} else {
		lower := il.Lower
		if usernsFD >= 0 {
			if err := idmapMount(il.Lower, usernsFD, il.LowerMount); err != nil {
				return err
			}
			lower = il.LowerMount
		}
		opts := "lowerdir=" + lower + ",upperdir=" + il.Upper + ",workdir=" + il.Work
		if cfg.Rootless {
			opts += ",userxattr"
		}
		err := mount("overlay", r, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
		if usernsFD >= 0 {
			// The overlay holds its own reference to the layer.
			_ = unix.Unmount(il.LowerMount, unix.MNT_DETACH)
		}
		if err != nil {
			return err
		}
	}
	for _, d := range []struct {
		path string
		mode uint32
	}{
		{"/etc", 0o755}, {"/home", 0o755}, {mechanism.Home, 0o755}, {"/tmp", 0o1777},
		{"/dev", 0o755}, {"/proc", 0o555}, {"/root", 0o700}, {"/run", 0o755},
	} {
		if err := mountpath.RealDir(r, d.path, d.mode, own); err != nil {
			return err
		}
	}
	all := etcfiles.Files(cfg.Hostname)
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if err := replaceFile(r+"/etc/"+name, all[name], own); err != nil {
			return err
		}
	}
	if err := buildDev(r + "/dev"); err != nil {
		return err
	}
	return bindHome(cfg)
}

// replaceFile writes content at p (whose directory mountpath.RealDir made) as a new
// file: whatever the image has there, a symlink included, is removed, not
// written through. The file is owned by host id own unless own < 0.
func replaceFile(p, content string, own int) error {
	if err := unix.Unlink(p); err != nil && err != unix.ENOENT {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	_, err = unix.Write(fd, []byte(content))
	if err == nil && own >= 0 {
		err = unix.Fchown(fd, own, own)
	}
	unix.Close(fd)
	return err
}

// buildDev mounts the sandbox's /dev at dev (for the host's root in
// buildTreeShared and for an image's): a tmpfs with the harmless devices bound from the
// host, read-only binds, the usual links, and mount points for pts and
// shm.
func buildDev(dev string) error {
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	for _, d := range devNodes {
		// mknod, not a create: no descriptor is ever open on /dev, so a
		// concurrent fork cannot make its read-only remount busy.
		if err := unix.Mknod(dev+"/"+d, unix.S_IFREG|0o644, 0); err != nil {
			return err
		}
		if err := mount("/dev/"+d, dev+"/"+d, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		// Read-only: the device still reads and writes; its node (the
		// host's) cannot be chmod-ed or touched.
		if err := mount("", dev+"/"+d, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		if err := os.Symlink(target, dev+"/"+name); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(dev+"/"+d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// imageUser is the uid and gid the workload of spec runs as, as root:
// the image's user unless that is root, else the jail's; with rootOK
// (a mapped sandbox on an idmapped layer) the image's user, root
// included.
func (j *Jail) imageUser(spec mechanism.Spec, rootOK bool) (uid, gid int) {
	if spec.Image != nil && (spec.Image.UID > 0 || rootOK) {
		return spec.Image.UID, spec.Image.GID
	}
	return j.cfg.UID, j.cfg.GID
}

// layerBytes is the bytes allocated on the host to the writable layer of
// st, an image sandbox's whose state is in dir: its upper/ on an overlay
// (in its bounded layer/, or beside its home), or its copy of the image
// where there is no overlayfs; 0 for a sandbox on the host's root. It is
// what the sandbox holds on the host besides its home (Usage).
func layerBytes(ctx context.Context, dir string, st *state) int64 {
	il := imageDirs(dir, st.Spec.Image, st.Layer != nil)
	if il == nil {
		return 0
	}
	if il.Copy != "" {
		return allocatedUnder(ctx, il.Copy)
	}
	return allocatedUnder(ctx, il.Upper)
}

// allocatedUnder is the bytes allocated on disk to what root holds (its
// files' blocks, root's included), as far as it gets before ctx ends.
func allocatedUnder(ctx context.Context, root string) int64 {
	var n int64
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if info, err := d.Info(); err == nil {
			if s, ok := info.Sys().(*syscall.Stat_t); ok {
				n += s.Blocks * 512
			}
		}
		return nil
	})
	return n
}
