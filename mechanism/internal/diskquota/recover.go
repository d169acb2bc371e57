package diskquota

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A loop quota moves the files a home already holds into its image
// (Apply: copied in, then removed from under the mount point). Releasing
// the image removes them with it, which is right for a sandbox's own home
// and wrong for one its caller gave with files in it, when nothing has
// recorded the quota: an Apply cut short (its process killed after the
// mount), or a caller that failed before it recorded the Quota. Recover
// is what such a caller does instead of Release.

// recoverTemp is the name a file being copied back is written under,
// in the directory it goes to, before it is renamed into place (with
// '~' added while the image has a file of that name): a copy cut short
// leaves no partial file under the real name (a later Recover would keep
// it as the original), only this, which a later Recover removes.
const recoverTemp = ".diskquota-recover.tmp"

// Recover gives home back what a loop quota of image on home holds,
// then releases the quota: the image's file system is mounted beside the
// image (image + ".recover"), the home is unmounted, each file of the
// image no longer under home is copied back there (cp -a: owners, modes
// and times kept), the home's root takes the owner and mode of the
// image's, and the image is unmounted and removed. A file still
// under home is the original and is kept: Apply removes one only after
// its copy is complete, and a copy cut short may be partial.
//
// The home is the one the image was made for, as Apply recorded it on
// the image (an extended attribute), where that is not home (a retry
// that gives another); home where none is recorded. The image may be
// mounted on it (an Apply or a Provision cut short) or
// not (a reboot since). An image that holds no file system (made, not
// formatted: nothing was moved into it) is removed; one whose file system
// cannot be mounted is left, and is an error. No image, mounted or not,
// is nil. A Recover cut short is finished by another: the image is
// removed only once everything is back.
func Recover(ctx context.Context, home, image string) error {
	if made := RecordedHome(image); made != "" {
		home = made
	}
	onHome, err := Mounted(home, image)
	if err != nil {
		return err
	}
	mnt := image + ".recover"
	onMnt, err := Mounted(mnt, image)
	if err != nil {
		return err
	}
	if !onHome && !onMnt {
		if _, err := os.Lstat(image); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(mnt)
			return nil
		} else if err != nil {
			return err
		}
		if ok, err := hasExt4(image); err != nil {
			return err
		} else if !ok {
			_ = os.Remove(mnt)
			return os.Remove(image)
		}
	}
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	switch {
	case onMnt: // a Recover cut short mounted it there
	case onHome:
		// A second mount of the same file system, which keeps it (and its
		// loop device) when the home's is taken off.
		if err := unix.Mount(home, mnt, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", home, mnt, err)
		}
	default:
		if attached(image) {
			// Mounted elsewhere: a second device on it would corrupt it.
			return fmt.Errorf("the image %s of %s is attached to a loop device, and not mounted on the home", image, home)
		}
		if err := attachAndMount(image, mnt); err != nil {
			return fmt.Errorf("the image %s may hold the files of %s and cannot be mounted (it is left): %w", image, home, err)
		}
	}
	if err := unmountAll(home, image); err != nil {
		return err
	}
	if err := os.MkdirAll(home, 0o755); err != nil { // removed since
		return err
	}
	// The image's lost+found, if an Apply was cut short before it removed
	// it (the home's own, if it had one, came after and is not empty).
	_ = os.Remove(filepath.Join(mnt, "lost+found"))
	if err := restoreMissing(ctx, mnt, home); err != nil {
		return fmt.Errorf("copy the files of %s back from %s: %w", home, image, err)
	}
	// The home's root as it was last (the directory under the mount
	// point was made root's, 0755, by attachAndMount).
	var root unix.Stat_t
	if err := unix.Stat(mnt, &root); err != nil {
		return err
	}
	if err := os.Lchown(home, int(root.Uid), int(root.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(home, root.Mode&0o7777); err != nil {
		return err
	}
	// What was copied back is on the host's disk before the image goes:
	// a crash in between leaves the image, which a Recover reads again.
	if err := syncFS(home); err != nil {
		return err
	}
	if err := unmountAll(mnt, image); err != nil {
		return err
	}
	waitDetached(image, 5*time.Second)
	if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Remove(mnt)
}

// hasExt4 reports whether path holds an ext2/3/4 superblock (its magic,
// 0xEF53, at byte 1080). mke2fs writes the superblock last: a file it
// did not finish has none.
func hasExt4(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var b [2]byte
	if _, err := f.ReadAt(b[:], 1024+0x38); err != nil {
		return false, nil // shorter than a superblock
	}
	return b[0] == 0x53 && b[1] == 0xEF, nil
}

// restoreMissing copies into dst each entry of src that dst lacks (cp -a
// into recoverTemp, then renamed), and goes down into the directories both
// have. What dst has is kept.
func restoreMissing(ctx context.Context, src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	// A name the image does not have: what dst has under it is a copy
	// cut short (the image is never written to; the home's own files
	// are all in it).
	name := recoverTemp
	for slices.ContainsFunc(ents, func(e fs.DirEntry) bool { return e.Name() == name }) {
		name += "~"
	}
	tmp := filepath.Join(dst, name)
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	for _, e := range ents {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		fi, err := os.Lstat(d)
		if err == nil {
			if e.IsDir() && fi.IsDir() {
				if err := restoreMissing(ctx, s, d); err != nil {
					return err
				}
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		cmd := exec.CommandContext(ctx, "cp", "-a", "--", s, tmp)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.RemoveAll(tmp)
			return fmt.Errorf("cp %s: %v: %s", d, err, strings.TrimSpace(string(out)))
		}
		if err := os.Rename(tmp, d); err != nil {
			return err
		}
	}
	return nil
}

// homeAttr is the extended attribute of a loop image that names the home
// it was made for (Apply sets it; Recover reads it). trusted.*: only
// root, which a loop quota needs, sets or reads it.
const homeAttr = "trusted.diskquota.home"

// markImage records home on image, where its file system takes extended
// attributes (Recover falls back to the home it is given).
func markImage(image, home string) {
	if abs, err := filepath.Abs(home); err == nil {
		_ = unix.Setxattr(image, homeAttr, []byte(abs), 0)
	}
}

// RecordedHome is the home a loop image was made for, as Apply recorded
// it on the image, or "" (no image, none recorded, or a file system
// without extended attributes).
func RecordedHome(image string) string {
	b := make([]byte, unix.PathMax)
	n, err := unix.Getxattr(image, homeAttr, b)
	if err != nil || n <= 0 {
		return ""
	}
	return string(b[:n])
}

// attached reports whether a loop device is backed by image.
func attached(image string) bool {
	path, err := filepath.EvalSymlinks(image)
	if err != nil {
		return false
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range backing {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == path {
			return true
		}
	}
	return false
}
