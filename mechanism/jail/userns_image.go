package jail

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// On an image, a sandbox with an id range of its own may give its
// workload root of its user namespace. The image's unpacked root is
// shared read-only by every sandbox and owned by the host's root on
// disk; it is mounted under the sandbox's overlay through an idmapped
// mount (open_tree(OPEN_TREE_CLONE) + mount_setattr(MOUNT_ATTR_IDMAP)
// with the sandbox's user namespace), so that inside the sandbox its
// files are owned by root (and the image's other users) of that
// namespace, while the overlay's upper layer, the sandbox's own, takes
// every write, owned by the sandbox's range on the host. overlayfs takes
// idmapped lower layers from Linux 5.19; idmapProbe tries it once per
// file system, and where it fails the sandbox keeps the behaviour it had
// before ranges existed (the workload is not root, and writes only its
// home and /tmp).

// idmapProbes caches idmapProbe's answer per file system (st_dev).
var idmapProbes sync.Map // uint64 -> error (nil: works)

// idmapProbe reports whether an overlay can be mounted on an idmapped
// mount of lower (on its file system), trying it in scratch, a directory
// on a file system that can hold an overlay's upper layer. Once per file
// system per process.
func idmapProbe(scratch, lower string) error {
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		return err
	}
	if v, ok := idmapProbes.Load(st.Dev); ok {
		err, _ := v.(error)
		return err
	}
	err := tryIdmapOverlay(scratch, lower, int(st.Uid))
	if err != nil {
		err = fmt.Errorf("no overlay on an idmapped image layer here: %w", err)
	}
	idmapProbes.Store(st.Dev, err)
	return err
}

// idmapKernel is idmapProbe on a scratch directory of its own under
// os.TempDir() (for the doctor's description).
var idmapKernel = sync.OnceValue(func() error {
	if !overlayOnce() {
		return errors.New("no overlayfs")
	}
	dir, err := os.MkdirTemp("", "managoat-idmap-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lower := filepath.Join(dir, "image")
	if err := os.Mkdir(lower, 0o755); err != nil {
		return err
	}
	return idmapProbe(dir, lower)
})

func tryIdmapOverlay(scratch, lower string, lowerUID int) error {
	if !overlayOnce() {
		return errors.New("no overlayfs")
	}
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	dir, err := os.MkdirTemp(scratch, ".idmap-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	ns, err := holdUserns(idRangeFirst)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	var perr error
	onDiscardedThread(func() {
		if perr = unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); perr != nil {
			return
		}
		if perr = mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); perr != nil {
			return
		}
		if perr = idmapMount(lower, ns, filepath.Join(dir, "l")); perr != nil {
			return
		}
		opts := "lowerdir=" + filepath.Join(dir, "l") + ",upperdir=" + filepath.Join(dir, "u") + ",workdir=" + filepath.Join(dir, "w")
		if perr = mount("overlay", filepath.Join(dir, "m"), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); perr != nil {
			return
		}
		var st unix.Stat_t
		if perr = unix.Stat(filepath.Join(dir, "m"), &st); perr != nil {
			return
		}
		// The merged root is the upper directory's (made by root);
		// a lower directory shows the mapping.
		want := uint32(lowerUID + idRangeFirst)
		if lowerUID >= idRangeSize {
			want = 65534 // unmapped: the overflow uid
		}
		if err := unix.Stat(filepath.Join(dir, "l"), &st); err != nil {
			perr = err
		} else if st.Uid != want && lowerUID < idRangeSize {
			perr = fmt.Errorf("the idmapped layer shows uid %d, want %d", st.Uid, want)
		}
		// The thread, and with it its mount namespace, is discarded.
	})
	return perr
}

// idmapMount mounts src at dst through an idmapped mount whose mapping is
// user namespace usernsFD's, read-only, nosuid, nodev, in the calling
// thread's mount namespace.
func idmapMount(src string, usernsFD int, dst string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(usernsFD),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the idmapped %s on %s: %w", src, dst, err)
	}
	return nil
}

// holdUserns returns a descriptor of a new user namespace mapping
// 0..idRangeSize-1 to base.. (uids and gids), owned by host uid base
// (cinit.c become_owner, ownNewUserns). Where there is a C init, it is made by that
// program in a mode of its own (cinit.c hold_userns: unshare, say so,
// wait to be killed), started with vfork: a child cloned into a new user
// namespace is a full fork of this process, whose cost grows with its
// memory (8-12 ms for a test process holding an image's layers). The
// manager maps it, opens it and kills the process. Without a C init,
// holdUsernsTraced.
func holdUserns(base int) (int, error) {
	m := fmt.Sprintf("0 %d %d\n", base, idRangeSize)
	return holdUsernsMap(base, m, m)
}

// holdUsernsMap is holdUserns with the given uid_map and gid_map (one
// line each, "inside outside count"), owned by host uid owner.
func holdUsernsMap(owner int, uidMap, gidMap string) (int, error) {
	mode := initMode()
	if mode == initGo {
		return holdUsernsTraced(owner, uidMap, gidMap)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return -1, err
	}
	defer devnull.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer readyR.Close()
	defer readyW.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"managoat-userns"}
	cmd.Env = []string{helperEnv + "=cinit"}
	cmd.ExtraFiles = []*os.File{devnull, cfgR, readyW}
	if mode == initStandalone {
		f, _ := standaloneInit()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		cmd.Path = "/proc/self/fd/" + strconv.Itoa(2+len(cmd.ExtraFiles))
		cmd.Env = []string{}
	}
	// No Pdeathsig: it is the forking thread's death, and the runtime may
	// later lock that thread and discard it (onDiscardedThread). The
	// process ends at the end of the config pipe: when this function
	// closes it, or when this process dies.
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("make a user namespace: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	cfgR.Close()
	readyW.Close()
	// cinit.c's struct ci_config, flag 16, and a one-instruction filter
	// it never loads.
	b := make([]byte, 0, 44)
	for _, v := range []uint32{cInitMagic, cInitVersion, 0, 0, 16, 0, 0, 1, uint32(owner)} {
		b = ne.AppendUint32(b, v)
	}
	b = ne.AppendUint16(b, unix.BPF_RET|unix.BPF_K)
	b = append(b, 0, 0)
	b = ne.AppendUint32(b, unix.SECCOMP_RET_ALLOW)
	if _, err := cfgW.Write(b); err != nil {
		return -1, fmt.Errorf("make a user namespace: %w", err)
	}
	line, _ := bufio.NewReader(readyR).ReadString('\n')
	if line != "userns\n" {
		return -1, fmt.Errorf("make a user namespace: %s", strings.TrimSpace(line))
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	for _, f := range []struct{ name, m string }{{"uid_map", uidMap}, {"gid_map", gidMap}} {
		if err := os.WriteFile("/proc/"+pid+"/"+f.name, []byte(f.m), 0); err != nil {
			return -1, fmt.Errorf("map a user namespace: %w", err)
		}
	}
	fd, err := unix.Open("/proc/"+pid+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("hold a user namespace: %w", err)
	}
	return fd, nil
}

// holdUsernsTraced is holdUserns without a C init (the Go one only). No
// process runs in the namespace: it is made by a child cloned into it,
// which stops at its exec (traced) and is killed there, never running a
// single instruction of the program; the descriptor keeps the namespace.
func holdUsernsTraced(owner int, uidMap, gidMap string) (int, error) {
	um, err1 := parseIDMap(uidMap)
	gm, err2 := parseIDMap(gidMap)
	if err1 != nil || err2 != nil {
		return -1, fmt.Errorf("internal: id maps %q %q", uidMap, gidMap)
	}
	fd, err := -1, error(nil)
	onDiscardedThread(func() {
		sys := &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER, UidMappings: um, GidMappings: gm,
			// setgroups stays allowed: a C init joining the namespace
			// drops its groups (cinit.c join_userns), and so does it
			// for each workload.
			GidMappingsEnableSetgroups: true,
			Ptrace:                     true, Pdeathsig: syscall.SIGKILL,
		}
		if err = ownNewUserns(sys, owner); err != nil { // userns.go
			return
		}
		var pid int
		pid, err = syscall.ForkExec("/proc/self/exe", []string{"managoat-userns"}, &syscall.ProcAttr{Env: []string{}, Sys: sys})
		if err != nil {
			err = fmt.Errorf("make a user namespace: %w", err)
			return
		}
		fd, err = unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		unix.Kill(pid, unix.SIGKILL)
		for {
			if _, werr := unix.Wait4(pid, nil, unix.WALL, nil); werr != unix.EINTR {
				break
			}
		}
	})
	return fd, err
}

// parseIDMap reads one uid_map line, "inside outside count".
func parseIDMap(m string) ([]syscall.SysProcIDMap, error) {
	var in, out, n int
	if _, err := fmt.Sscanf(m, "%d %d %d", &in, &out, &n); err != nil {
		return nil, err
	}
	return []syscall.SysProcIDMap{{ContainerID: in, HostID: out, Size: n}}, nil
}
