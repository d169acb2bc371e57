package egresstest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
)

// The environment of a test binary Unprivileged runs again.
const (
	envDial = "MANAGOAT_EGRESSTEST_DIAL" // the parent's dial socket
	envCA   = "MANAGOAT_EGRESSTEST_CA"   // the fake internet's CA (PEM file)
)

// UnprivilegedUID is the user Unprivileged runs tests as (nobody).
const UnprivilegedUID = 65534

// Unprivileged runs part of the calling test again as an unprivileged
// user, against this process's stand-in internet, to test what a
// manager that is not root (a rootless sandbox's) does.
//
//	func TestRootless(t *testing.T) {
//		in := egresstest.Unprivileged(t, "")
//		if in == nil {
//			return // root: the test ran as nobody, its result is this one's
//		}
//		// here as nobody; in.Dial reaches the fake internet
//	}
//
// As root (the process go test started) it builds the Internet, serves
// its Dial on a Unix socket, runs this test binary again as uid 65534
// with -test.run selecting the calling test (and sub, a subtest pattern,
// when not ""), with a temporary and home directory of that user's, logs
// its output, fails the test when the run failed or ran nothing, skips
// it when the run or a subtest skipped (fails under CI=true), and
// returns nil. In that run it returns an
// Internet whose Dial asks the parent to dial in the fake internet and
// hand the connection over (SCM_RIGHTS): only the parent can enter the
// fake internet's namespace. Without root it skips (fails under CI=true).
func Unprivileged(t *testing.T, sub string) *Internet {
	t.Helper()
	if path := os.Getenv(envDial); path != "" {
		pem, err := os.ReadFile(os.Getenv(envCA))
		if err != nil {
			t.Fatalf("egresstest: the parent's CA: %v", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		return &Internet{NS: -1, DNS: Resolver, CA: pool, CAPEM: pem, dialPath: path}
	}
	testenv.RequireRoot(t)
	for _, f := range []string{"/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces"} {
		b, err := os.ReadFile(f)
		testenv.Require(t, err != nil || strings.TrimSpace(string(b)) != "0",
			"unprivileged users may not make user namespaces here ("+f+" is 0)")
	}
	in := New(t)
	dir := t.TempDir()
	// The unprivileged run must reach its directory (the test's and the
	// enclosure's temporary directories are root's only).
	if err := testenv.Traversable(dir); err != nil {
		t.Fatal(err)
	}
	// Short: Unix sockets the run binds below it must fit in 108 bytes.
	home, err := os.MkdirTemp("", "u")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chown(home, UnprivilegedUID, UnprivilegedUID); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "dial.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sock, UnprivilegedUID, UnprivilegedUID); err != nil {
		t.Fatal(err)
	}
	in.serveDial(ln)
	run := "^" + t.Name() + "$"
	if sub != "" {
		run += "/" + sub
	}
	ctx := context.Background()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
		defer cancel()
	}
	// A copy of the test binary the user can execute (go test's is in a
	// directory of root's only).
	bin := filepath.Join(dir, "test.bin")
	if err := copyExe(bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "-test.run="+run, "-test.count=1", "-test.v")
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "TMPDIR", "HOME", "XDG_RUNTIME_DIR", "USER", "LOGNAME", envDial, envCA:
		default:
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "TMPDIR="+home, "HOME="+home, envDial+"="+sock, envCA+"="+ca)
	cmd.Dir = home
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: UnprivilegedUID, Gid: UnprivilegedUID, Groups: []uint32{}},
		Setsid:     true,
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		t.Log("uid 65534: " + l)
	}
	switch {
	case err != nil:
		t.Fatalf("the run as uid %d failed: %v", UnprivilegedUID, err)
	case strings.Contains(out.String(), "--- SKIP: "+t.Name()):
		// The test or one of its subtests skipped.
		testenv.Require(t, false, "the run as uid 65534 skipped (see its log)")
	case strings.Contains(out.String(), "--- PASS: "+t.Name()):
	default:
		t.Fatalf("the run as uid %d ran no test %s", UnprivilegedUID, run)
	}
	return nil
}

// serveDial serves Dial to an unprivileged run: one request per
// connection, "network address\n", answered "OK\n" with the connection's
// descriptor, or "ERR message\n".
func (in *Internet) serveDial(ln *net.UnixListener) {
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			in.wg.Add(1)
			go func() {
				defer in.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				network, addr, _ := strings.Cut(strings.TrimSpace(line), " ")
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				out, err := in.Dial(ctx, network, addr)
				if err != nil {
					fmt.Fprintf(c, "ERR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
					return
				}
				defer out.Close()
				rc, err := out.(syscall.Conn).SyscallConn()
				if err != nil {
					fmt.Fprintf(c, "ERR %v\n", err)
					return
				}
				_ = rc.Control(func(fd uintptr) {
					_, _, err = c.WriteMsgUnix([]byte("OK\n"), unix.UnixRights(int(fd)), nil)
				})
			}()
		}
	}()
	in.onClose(func() { ln.Close() })
}

// dialVia asks the parent (serveDial at path) for a connection.
func dialVia(ctx context.Context, path, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	} else {
		uc.SetDeadline(time.Now().Add(20 * time.Second))
	}
	if _, err := fmt.Fprintf(uc, "%s %s\n", network, addr); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msg := strings.TrimSpace(string(buf[:n]))
	var fds []int
	if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range cms {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if msg != "OK" || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if rest, ok := strings.CutPrefix(msg, "ERR "); ok {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New(rest)}
		}
		return nil, fmt.Errorf("egresstest: dial %s %s: answer %q", network, addr, msg)
	}
	unix.CloseOnExec(fds[0])
	f := os.NewFile(uintptr(fds[0]), network+" "+addr)
	defer f.Close()
	return net.FileConn(f)
}

// copyExe copies this process's binary to path (mode 0755).
func copyExe(path string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
