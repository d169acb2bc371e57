package jail

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
