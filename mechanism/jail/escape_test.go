package jail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// buildEscape compiles testdata/escape/<name>.c with gcc, statically
// where the C library allows it, and returns the program's path.
func buildEscape(t *testing.T, name string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	testenv.Require(t, err == nil, "gcc is needed to build the escape programs")
	src, err := filepath.Abs(filepath.Join("testdata", "escape", name+".c"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	if b, err := exec.Command(gcc, "-O2", "-Wall", "-static", "-o", out, src).CombinedOutput(); err != nil {
		if b2, err2 := exec.Command(gcc, "-O2", "-Wall", "-o", out, src).CombinedOutput(); err2 != nil {
			t.Fatalf("gcc %s: %v\n%s\n%s", name, err2, b, b2)
		}
	}
	return out
}

// installInHome copies the program at host into sandbox id's home as
// name, owned by the workload, and returns its path inside.
func installInHome(t *testing.T, j *Jail, id, host, name string) string {
	t.Helper()
	b, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	inside := "/home/sprite/" + name
	p, err := j.HostPath(id, inside)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := j.OwnerOf(id)
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	return inside
}

// TestStackedFilterCannotUndoTheDenyList is the stacked-filter attack
// (testdata/escape/stackclone3.c): the workload installs a filter of its
// own answering clone3 with RET_USER_NOTIF, answers CONTINUE from a
// forked helper, and calls clone3(CLONE_NEWUSER|CLONE_NEWNET). The
// jail's verdict must outrank it: clone3 fails with ENOSYS. Fails on the
// old code (clone3 answered RET_TRACE): the child is root of a new user
// namespace, CapEff 000001ffffffffff.
func TestStackedFilterCannotUndoTheDenyList(t *testing.T) {
	prog := buildEscape(t, "stackclone3")
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "stack")
			inside := installInHome(t, j, "stack", prog, "stackclone3")
			c, err := j.Execute(context.Background(), "stack", []string{inside}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out := string(c.Stdout)
			if !strings.Contains(out, "filter stacked\n") {
				t.Fatalf("the workload could not stack its filter (the attack did not run): exit %d, %q %q", c.ExitStatus, out, c.Stderr)
			}
			if c.ExitStatus != 0 || !strings.Contains(out, "clone3 refused: Function not implemented") {
				t.Fatalf("clone3 under a stacked USER_NOTIF filter: exit %d, %q %q", c.ExitStatus, out, c.Stderr)
			}
		})
	}
}

// ptyHog opens terminals until the kernel refuses one (its open-file
// limit raised to its hard limit first), says how many and why, and holds
// them until its stdin closes.
const ptyHog = `import errno, os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds, why = [], "none"
while len(fds) < 5000:
    try:
        m, s = os.openpty()
    except OSError as e:
        why = errno.errorcode[e.errno]
        break
    os.close(s)
    fds.append(m)
print("nofile %d %d opened %d %s" % (soft, hard, len(fds), why), flush=True)
sys.stdin.read()
`

// openptyWorks is a workload's openpty, printing "openpty ok" or why not.
const openptyWorks = `import os
try:
    m, s = os.openpty()
    print("openpty ok")
except OSError as e:
    print("openpty failed:", e)
`

// TestPtyExhaustionStaysInItsSandbox: a sandbox that opens every
// terminal it can gets at most ptyMax (its devpts instance's max=) and
// ENOSPC, and while it holds them another sandbox's openpty, and the
// host's, still work; a command's open-file limit is workloadNoFile
// (soft) and at most workloadNoFileMax (hard). Fails on the old code:
// the hog got 3,071 ptys, and the other sandbox's openpty ENOSPC; its
// limit was the manager's (20000:20000 here).
func TestPtyExhaustionStaysInItsSandbox(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			hog := startedJail(t, mode, "hog")
			other := startedJail(t, mode, "other")
			line := make(chan string, 1)
			stdin, release := io.Pipe()
			done := make(chan error, 1)
			go func() {
				var out []byte
				c, err := hog.Execute(context.Background(), "hog", []string{"python3", "-c", ptyHog}, mechanism.ExecOptions{
					Stdin: stdin, Timeout: time.Minute,
					OnOutput: func(s mechanism.Stream, chunk []byte) {
						if s != mechanism.Stdout {
							return
						}
						out = append(out, chunk...)
						if i := bytes.IndexByte(out, '\n'); i >= 0 {
							select {
							case line <- string(out[:i]):
							default:
							}
						}
					},
				})
				if err == nil && c.ExitStatus != 0 {
					err = fmt.Errorf("the hog exited %d: %s", c.ExitStatus, c.Stderr)
				}
				done <- err
			}()
			defer func() {
				release.Close()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			var got string
			select {
			case got = <-line:
			case err := <-done:
				done <- err
				t.Fatalf("the hog ended before it said anything: %v", err)
			}
			var soft, hard, opened int
			var why string
			if _, err := fmt.Sscanf(got, "nofile %d %d opened %d %s", &soft, &hard, &opened, &why); err != nil {
				t.Fatalf("hog said %q: %v", got, err)
			}
			t.Logf("hog: %s", got)
			if soft != workloadNoFile || hard > workloadNoFileMax || hard < soft {
				t.Errorf("a command's open-file limit is %d:%d, want %d:at most %d", soft, hard, workloadNoFile, workloadNoFileMax)
			}
			if opened > ptyMax || why != "ENOSPC" {
				t.Errorf("one sandbox opened %d terminals (then %s), want at most %d, then ENOSPC", opened, why, ptyMax)
			}
			c, err := other.Execute(context.Background(), "other", []string{"python3", "-c", openptyWorks}, mechanism.ExecOptions{})
			if err != nil || !strings.Contains(string(c.Stdout), "openpty ok") {
				t.Errorf("another sandbox's openpty while the hog holds its terminals: %q %q, %v", c.Stdout, c.Stderr, err)
			}
			ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
			if err != nil {
				t.Errorf("the host's openpty while the hog holds its terminals: %v", err)
			} else {
				ptmx.Close()
			}
		})
	}
}

// inotifyHog makes inotify instances until the kernel refuses one, says
// how many and why, and holds them until its stdin closes.
const inotifyHog = `import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
fds, why = [], "none"
while len(fds) < 900:
    fd = libc.inotify_init1(0)
    if fd < 0:
        why = errno.errorcode[ctypes.get_errno()]
        break
    fds.append(fd)
print("opened %d %s" % (len(fds), why), flush=True)
sys.stdin.read()
`

// holdWhile runs script in sandbox id of j until the returned release is
// called, and returns the first line it printed.
func holdWhile(t *testing.T, j *Jail, id, script string) (first string, release func()) {
	t.Helper()
	line := make(chan string, 1)
	stdin, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		var out []byte
		c, err := j.Execute(context.Background(), id, []string{"python3", "-c", script}, mechanism.ExecOptions{
			Stdin: stdin, Timeout: time.Minute,
			OnOutput: func(s mechanism.Stream, chunk []byte) {
				if s != mechanism.Stdout {
					return
				}
				out = append(out, chunk...)
				if i := bytes.IndexByte(out, '\n'); i >= 0 {
					select {
					case line <- string(out[:i]):
					default:
					}
				}
			},
		})
		if err == nil && c.ExitStatus != 0 {
			err = fmt.Errorf("%s exited %d: %s", id, c.ExitStatus, c.Stderr)
		}
		done <- err
	}()
	release = func() {
		w.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	select {
	case first = <-line:
	case err := <-done:
		done <- err
		release()
		t.Fatalf("%s ended before it said anything: %v", id, err)
	}
	return first, release
}

// TestInotifyQuotaIsTheSandboxs: a sandbox that makes every inotify
// instance it can gets the per-user bound (user.max_inotify_instances)
// and EMFILE, and while it holds them the host's root and another
// sandbox still make one: each sandbox's user namespace is owned by its
// range's first id (cinit.c become_owner), to which the kernel charges
// it in the host's namespace. Fails on the old code (namespaces owned by
// the host's root): host root's inotify_init1 EMFILE.
func TestInotifyQuotaIsTheSandboxs(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/user/max_inotify_instances")
	if err != nil {
		t.Fatal(err)
	}
	limit, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			hog := startedJail(t, mode, "hog")
			other := startedJail(t, mode, "other")
			if base, _, _ := hog.IDRange("hog"); base == 0 {
				testenv.Require(t, false, "the sandbox has no uid range of its own: "+hog.usernsSupport().Error())
			}
			got, release := holdWhile(t, hog, "hog", inotifyHog)
			defer release()
			var opened int
			var why string
			if _, err := fmt.Sscanf(got, "opened %d %s", &opened, &why); err != nil {
				t.Fatalf("hog said %q: %v", got, err)
			}
			t.Logf("hog: %s (user.max_inotify_instances %d)", got, limit)
			if opened > limit || why != "EMFILE" {
				t.Errorf("one sandbox made %d inotify instances (then %s), want at most %d, then EMFILE", opened, why, limit)
			}
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				t.Errorf("host root's inotify_init1 while the sandbox holds its instances: %v", err)
			} else {
				unix.Close(fd)
			}
			c, err := other.Execute(context.Background(), "other", []string{"python3", "-c",
				"import ctypes; fd = ctypes.CDLL(None, use_errno=True).inotify_init1(0); print('inotify ok' if fd >= 0 else 'inotify failed %d' % ctypes.get_errno())"}, mechanism.ExecOptions{})
			if err != nil || !strings.Contains(string(c.Stdout), "inotify ok") {
				t.Errorf("another sandbox's inotify_init1 while the hog holds its instances: %q %q, %v", c.Stdout, c.Stderr, err)
			}
		})
	}
}

// setIDAttempts tries, in the read-write bind at src, every way a
// workload gives a file a set-user-ID or set-group-ID bit: chmod (the
// program and each system call), install -m, a creating open and mknod
// with the bits in the mode; each says what it got.
const setIDAttempts = `cd ~/src
cp /bin/sh sh && echo copied
chmod 4755 sh && echo chmod-4755-ok
chmod u+s sh && echo chmod-us-ok
chmod g+s sh && echo chmod-gs-ok
install -m 2755 /bin/sh sh2 && echo install-ok
python3 - <<'PY'
import os, stat
for name, f in [
    ("open", lambda: os.close(os.open("o1", os.O_CREAT | os.O_WRONLY, 0o4755))),
    ("fchmod", lambda: (lambda fd: (os.fchmod(fd, 0o4755), os.close(fd)))(os.open("o2", os.O_CREAT | os.O_WRONLY, 0o755))),
    ("chmod", lambda: os.chmod("sh", 0o6755)),
    ("mknod", lambda: os.mknod("o3", stat.S_IFREG | 0o4755)),
]:
    try:
        f()
        print(name + "-ok")
    except OSError as e:
        print(name + "-refused", e.errno)
PY
echo written > new
stat -c 'src %u:%g' . ; id -u
`

// TestSetuidInABindCannotGainHostIDs: a sandbox with a read-write bind
// keeps its uid range (its workload is base+1000 on the host, no host
// account), the bind is idmapped so a directory root owns and bound is
// the workload's to write (files it makes there are root's on the host:
// issue 33's managoat run -v .:/home/sprite/src as root), and no file
// there can be made set-user-ID or set-group-ID, by any call: a
// set-user-ID copy of sh in the bind would run on the host with its
// owner's euid. Fails on the old code: the workload was host uid 1000, a
// real account, the bound root-owned directory was not writable, and
// chmod 4755 on its copy of sh in a directory of its own succeeded.
func TestSetuidInABindCannotGainHostIDs(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			testenv.RequireRoot(t)
			t.Setenv(initEnv, mode)
			src := t.TempDir() // root's, as a directory root binds
			if err := os.Chmod(src, 0o755); err != nil {
				t.Fatal(err)
			}
			j, err := New(Config{StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			if err := j.usernsSupport(); err != nil {
				testenv.Require(t, false, "no uid range for sandboxes here: "+err.Error())
			}
			ctx := context.Background()
			spec := mechanism.Spec{Mounts: []mechanism.Mount{{Source: src, Target: mechanism.Home + "/src"}}}
			if err := j.Provision(ctx, "bind", spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Destroy(context.Background(), "bind") })
			if err := j.Start(ctx, "bind"); err != nil {
				t.Fatal(err)
			}
			base, _, err := j.IDRange("bind")
			if err != nil || base == 0 {
				t.Fatalf("a sandbox with a host mount has no uid range of its own: %d, %v", base, err)
			}
			c, err := j.Execute(ctx, "bind", []string{"/bin/sh", "-c", setIDAttempts}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out := string(c.Stdout)
			t.Logf("workload: %q %q", out, c.Stderr)
			for _, w := range []string{"copied\n", "open-refused 1\n", "fchmod-refused 1\n", "chmod-refused 1\n", "mknod-refused 1\n", "src 1000:1000\n"} {
				if !strings.Contains(out, w) {
					t.Errorf("workload's output lacks %q: %q %q", w, out, c.Stderr)
				}
			}
			for _, bad := range []string{"chmod-4755-ok", "chmod-us-ok", "chmod-gs-ok", "install-ok", "-ok\n"} {
				if strings.Contains(out, bad) {
					t.Errorf("a set-id mode was given (%q): %q", bad, out)
				}
			}
			// Nothing in the source is set-id, and what the workload
			// made is its owner's (root's) on the host.
			err = filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
				if err != nil {
					return err
				}
				var st unix.Stat_t
				if err := unix.Lstat(p, &st); err != nil {
					return err
				}
				if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
					t.Errorf("%s is set-id on the host: mode %#o, owner %d", p, st.Mode&0o7777, st.Uid)
				}
				if st.Uid != 0 {
					t.Errorf("%s is owned by host uid %d, want the source's owner, 0", p, st.Uid)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(src, "new")); err != nil || string(b) != "written\n" {
				t.Errorf("the workload's write to the bound root-owned directory: %q, %v", b, err)
			}
			// The workload's own host uid: a file it makes in its home.
			c, err = j.Execute(ctx, "bind", []string{"/bin/sh", "-c", "echo x > ~/mine"}, mechanism.ExecOptions{})
			if err != nil || c.ExitStatus != 0 {
				t.Fatalf("%+v %v", c, err)
			}
			p, err := j.HostPath("bind", mechanism.Home+"/mine")
			if err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			if int(st.Uid) != base+1000 {
				t.Errorf("the workload's host uid is %d, want %d (its range's)", st.Uid, base+1000)
			}
			passwd, _ := os.ReadFile("/etc/passwd")
			for _, l := range strings.Split(string(passwd), "\n") {
				if f := strings.Split(l, ":"); len(f) > 2 && f[2] == strconv.Itoa(int(st.Uid)) {
					t.Errorf("the workload's host uid %d is a host account: %s", st.Uid, l)
				}
			}
		})
	}
}

// TestUnidmappableMountRefused: a host mount whose file system cannot be
// idmapped here (sysfs) refuses the sandbox at Provision, naming
// host_mounts and the way to run it unmapped; with Config.UnmappedMounts
// it runs, without a range of its own.
func TestUnidmappableMountRefused(t *testing.T) {
	testenv.RequireRoot(t)
	j, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.usernsSupport(); err != nil {
		testenv.Require(t, false, "no uid range for sandboxes here: "+err.Error())
	}
	ctx := context.Background()
	spec := mechanism.Spec{Mounts: []mechanism.Mount{{Source: "/sys/kernel/mm", Target: "/mnt/mm", ReadOnly: true}}}
	err = j.Provision(ctx, "sysfs", spec)
	var ue *mechanism.UnavailableError
	if !errors.As(err, &ue) || len(ue.Missing) != 1 || ue.Missing[0].Name != mechanism.HostMounts ||
		!strings.Contains(err.Error(), "MANAGOAT_JAIL_UNMAPPED_MOUNTS=1") || !strings.Contains(err.Error(), "cannot be idmapped") {
		t.Fatalf("Provision with a sysfs mount: %v, want host_mounts unavailable saying why and how to run it unmapped", err)
	}
	if s, err := j.Status(ctx, "sysfs"); s != mechanism.StatusAbsent || err != nil {
		t.Errorf("the refused sandbox: %s, %v; want absent", s, err)
	}
	if _, err := os.Stat(j.dir("sysfs")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused sandbox left its directory: %v", err)
	}
	j2, err := New(Config{StateDir: t.TempDir(), UnmappedMounts: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := j2.Provision(ctx, "sysfs", spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j2.Destroy(context.Background(), "sysfs") })
	if base, _, err := j2.IDRange("sysfs"); err != nil || base != 0 {
		t.Fatalf("unmapped mounts: range %d, %v", base, err)
	}
	if err := j2.Start(ctx, "sysfs"); err != nil {
		t.Fatal(err)
	}
	c, err := j2.Execute(ctx, "sysfs", []string{"/bin/sh", "-c", "ls /mnt/mm >/dev/null && echo listed"}, mechanism.ExecOptions{})
	if err != nil || string(c.Stdout) != "listed\n" {
		t.Fatalf("%q %q %v", c.Stdout, c.Stderr, err)
	}
}

// hostFactsScript tries the system calls Docker's default profile
// refuses that the deny-list once allowed, each with arguments the kernel
// would accept (so an EPERM is the filter's), and reads the proc entries
// that named host facts.
const hostFactsScript = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, nr in [("memfd_secret", 447), ("get_mempolicy", 239), ("set_mempolicy", 238), ("mbind", 237),
                 ("move_pages", 279), ("migrate_pages", 256), ("set_mempolicy_home_node", 450), ("io_setup", 206)]:
    ctx = ctypes.c_ulong(0)
    args = [ctypes.c_long(1), ctypes.byref(ctx)] if name == "io_setup" else [ctypes.c_long(0)] * 6
    r = libc.syscall(ctypes.c_long(nr), *args)
    e = ctypes.get_errno()
    print(name, {1: "EPERM", 38: "ENOSYS"}.get(e, "?") if r == -1 else "allowed: %d errno %d" % (r, e))
for p in ["/proc/key-users", "/proc/config.gz", "/proc/kallsyms", "/proc/keys", "/proc/kcore", "/proc/timer_list"]:
    try:
        with open(p, "rb") as f:
            print(p, len(f.read(1 << 20)), "bytes")
    except OSError as e:
        print(p, "unreadable", e.errno)
for d in ["/proc/acpi", "/proc/scsi", "/proc/asound"]:
    if os.path.isdir(d):
        print(d, len(os.listdir(d)), "entries")
`

// TestHostFactsMasked: memfd_secret and the NUMA memory-policy calls are
// EPERM, io_setup ENOSYS (kernel AIO's contexts are counted host-wide:
// 16 io_setup(4096) in a sandbox made the host's io_setup EAGAIN), and the proc files naming host facts (key-users: the host's uids
// with keys; config.gz: the kernel's configuration; kallsyms: its symbols)
// read empty, as do the masked proc directories. Fails on the old code:
// get_mempolicy and the others allowed, /proc/key-users and kallsyms read
// non-empty.
func TestHostFactsMasked(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the script uses x86-64 system call numbers")
	}
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "facts")
			c, err := j.Execute(context.Background(), "facts", []string{"python3", "-c", hostFactsScript}, mechanism.ExecOptions{})
			if err != nil || c.ExitStatus != 0 {
				t.Fatalf("%+v %v", c, err)
			}
			for _, l := range strings.Split(strings.TrimSpace(string(c.Stdout)), "\n") {
				f := strings.Fields(l)
				switch {
				case !strings.HasPrefix(l, "/"):
					// io_setup: ENOSYS, as without kernel AIO (policy.Jail).
					if want := map[bool]string{true: "ENOSYS", false: "EPERM"}[f[0] == "io_setup"]; f[1] != want {
						t.Errorf("%s, want %s", l, want)
					}
				case strings.HasSuffix(l, "entries"):
					if f[1] != "0" {
						t.Errorf("masked directory: %s", l)
					}
				default:
					if _, err := os.Stat(f[0]); err == nil && f[1] != "0" && f[1] != "unreadable" {
						t.Errorf("masked file: %s", l)
					}
				}
			}
			t.Logf("%s", c.Stdout)
		})
	}
}

// sigqueueHog queues a blocked real-time signal to itself until the
// kernel refuses one (RLIMIT_SIGPENDING), says how many, and holds them
// until its stdin closes. With "once" it queues one and says whether it
// could.
const sigqueueHog = `import ctypes, errno, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
class sigval(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]
sig = signal.SIGRTMIN + 1
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
limit = 1 if sys.argv[1:] == ["once"] else 1 << 20
n, why = 0, "none"
while n < limit:
    if libc.sigqueue(ctypes.c_int(libc.getpid()), ctypes.c_int(sig), sigval(0)) != 0:
        why = errno.errorcode[ctypes.get_errno()]
        break
    n += 1
print("queued %d %s" % (n, why), flush=True)
if limit > 1:
    sys.stdin.read()
`

// TestPendingSignalsAreTheSandboxs: a sandbox that queues every signal
// it can (RLIMIT_SIGPENDING) leaves the host's root and another sandbox
// able to queue one: the kernel charges pending signals to the owner of
// the sandbox's user namespace too, base, not the host's root. Fails on
// the old code (namespaces owned by root): the host's root's sigqueue
// EAGAIN while the hog holds its signals.
func TestPendingSignalsAreTheSandboxs(t *testing.T) {
	j := startedJail(t, InitModes()[0], "sighog")
	other := startedJail(t, InitModes()[0], "sigother")
	if base, _, _ := j.IDRange("sighog"); base == 0 {
		testenv.Require(t, false, "the sandbox has no uid range of its own: "+j.usernsSupport().Error())
	}
	got, release := holdWhile(t, j, "sighog", sigqueueHog)
	defer release()
	t.Logf("hog: %s", got)
	if !strings.HasSuffix(got, " EAGAIN") {
		t.Fatalf("hog said %q, want EAGAIN at its limit", got)
	}
	out, err := exec.Command("python3", "-c", sigqueueHog, "once").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "queued 1 none" {
		t.Errorf("host root's sigqueue while the sandbox holds its signals: %q, %v", out, err)
	}
	c, err := other.Execute(context.Background(), "sigother", []string{"python3", "-c", sigqueueHog, "once"}, mechanism.ExecOptions{})
	if err != nil || strings.TrimSpace(string(c.Stdout)) != "queued 1 none" {
		t.Errorf("another sandbox's sigqueue while the hog holds its signals: %q %q, %v", c.Stdout, c.Stderr, err)
	}
}
