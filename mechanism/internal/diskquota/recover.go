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
// and times kept), and the image is unmounted and removed. A file still
// under home is the original and is kept: Apply removes one only after
// its copy is complete, and a copy cut short may be partial.
//
// The image may be mounted on home (an Apply or a Provision cut short) or
// not (a reboot since). An image that holds no file system (made, not
// formatted: nothing was moved into it) is removed; one whose file system
// cannot be mounted is left, and is an error. No image, mounted or not,
// is nil. A Recover cut short is finished by another: the image is
// removed only once everything is back.
func Recover(ctx context.Context, home, image string) error {
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
		if err := attachAndMount(image, mnt); err != nil {
			return fmt.Errorf("the image %s may hold the files of %s and cannot be mounted (it is left): %w", image, home, err)
		}
	}
	if err := unmountAll(home, image); err != nil {
		return err
	}
	// The image's lost+found, if an Apply was cut short before it removed
	// it (the home's own, if it had one, came after and is not empty).
	_ = os.Remove(filepath.Join(mnt, "lost+found"))
	if err := restoreMissing(ctx, mnt, home); err != nil {
		return fmt.Errorf("copy the files of %s back from %s: %w", home, image, err)
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
