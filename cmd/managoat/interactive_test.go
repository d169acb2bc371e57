package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
)

// ptyRun is managoat started on a terminal of its own (a PTY the test
// holds the other end of), and what it wrote there so far.
type ptyRun struct {
	t    *testing.T
	cmd  *exec.Cmd
	tty  *os.File // managoat's terminal (the PTY's slave side, kept open)
	ptm  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func startOnPTY(t *testing.T, env []string, args ...string) *ptyRun {
	t.Helper()
	ptm, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := pty.Setsize(ptm, &pty.Winsize{Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	c := exec.Command(binary, args...)
	c.Env = append(os.Environ(), env...)
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	r := &ptyRun{t: t, cmd: c, tty: tty, ptm: ptm, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			r.mu.Lock()
			r.out.Write(buf[:n])
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
		tty.Close()
		ptm.Close()
		<-r.done
	})
	return r
}

// expect waits for want in what managoat wrote since the last expect.
func (r *ptyRun) expect(want string) {
	r.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the terminal's output
		r.mu.Lock()
		s := r.out.String()
		if i := strings.Index(s, want); i >= 0 {
			r.out.Next(i + len(want))
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			r.t.Fatalf("no %q on the terminal; it shows %q", want, s)
		}
	}
}

func (r *ptyRun) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.ptm, s); err != nil {
		r.t.Fatal(err)
	}
}

func (r *ptyRun) wait() int {
	r.t.Helper()
	timer := time.AfterFunc(20*time.Second, func() { _ = r.cmd.Process.Kill() })
	defer timer.Stop()
	err := r.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	} else if err != nil {
		r.t.Fatal(err)
	}
	return 0
}

// TestInteractiveTerminal drives managoat through a PTY as a user at a
// terminal would: exec -it gives the shell a terminal with job control
// (Ctrl-C interrupts its foreground job, Ctrl-Z stops one, jobs lists it
// and fg brings it back), the window
// size and its changes reach the command, managoat's terminal is raw
// while the command runs and as it was after; Ctrl-P Ctrl-Q detaches
// from a session that keeps running; without -t, a SIGINT to managoat
// reaches the command (signal proxy) instead of killing it.
func TestInteractiveTerminal(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "tty"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "tty") })

	r := startOnPTY(t, env, "exec", "-it", "tty", "--", "sh")
	before, err := unix.IoctlGetTermios(int(r.tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	r.expect("$ ")
	// Raw while it runs: managoat's terminal neither echoes nor cooks.
	var raw *unix.Termios
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) { // polling for raw mode
		raw, _ = unix.IoctlGetTermios(int(r.tty.Fd()), unix.TCGETS)
		if raw != nil && raw.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if raw == nil || raw.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) != 0 {
		t.Errorf("managoat's terminal is not raw while the command runs: lflag %#x", raw.Lflag)
	}
	r.send("stty size\r")
	r.expect("24 80\r\n")
	// The terminal is the sandbox's own (its devpts), so it has a name
	// there, and it is the sandbox user's.
	r.send("tty; stat -c %U /dev/pts/0\r")
	r.expect("/dev/pts/0\r\nsprite\r\n")
	if err := pty.Setsize(r.ptm, &pty.Winsize{Rows: 33, Cols: 101}); err != nil {
		t.Fatal(err)
	}
	// SIGWINCH goes to managoat's foreground process group, as the kernel
	// sends it on a resize of a terminal a process has open.
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.send("stty size\r")
		r.mu.Lock()
		got := strings.Contains(r.out.String(), "33 101")
		r.mu.Unlock()
		if got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resize did not reach the command: %q", r.out.String())
		}
		time.Sleep(200 * time.Millisecond) // polling for the resize
	}
	r.expect("33 101\r\n")
	// Job control: Ctrl-C interrupts the foreground job, not the shell;
	// Ctrl-Z stops one, which jobs lists and kill ends.
	r.send("sleep 100\r")
	r.expect("sleep 100\r\n")
	time.Sleep(300 * time.Millisecond) // the sleep starts
	r.send("\x03")
	r.send("echo status=$?\r")
	r.expect("status=130")
	r.send("sleep 101\r")
	r.expect("sleep 101\r\n")
	time.Sleep(300 * time.Millisecond)
	r.send("\x1a")
	r.expect("Stopped")
	r.send("jobs\r")
	r.expect("Stopped")
	r.send("fg\r")
	r.expect("sleep 101")
	time.Sleep(300 * time.Millisecond) // back in the foreground
	r.send("\x03")
	r.send("exit 3\r")
	if code := r.wait(); code != 3 {
		t.Errorf("exec -it of sh that exits 3: managoat exited %d; terminal: %q", code, r.out.String())
	}
	after, err := unix.IoctlGetTermios(int(r.tty.Fd()), unix.TCGETS)
	if err != nil || after.Lflag != before.Lflag || after.Iflag != before.Iflag || after.Oflag != before.Oflag {
		t.Errorf("the terminal was not restored: before %+v after %+v (%v)", before, after, err)
	}

	// Ctrl-P Ctrl-Q detaches: the session runs on, and attach finds it.
	r = startOnPTY(t, env, "spawn", "-t", "tty", "--", "sh", "-c", "echo ready; read x; echo got $x")
	r.expect("ready")
	r.send("\x10\x11")
	r.expect("detached from session ")
	if code := r.wait(); code != 0 {
		t.Errorf("detach: exit %d", code)
	}
	out, _, _ := managoatEnv(t, env, "sessions", "tty")
	if !strings.Contains(out, "running") {
		t.Errorf("the detached session does not run on:\n%s", out)
	}
	id := strings.Fields(out[strings.LastIndex(out[:strings.Index(out, "running")], "\n")+1:])[0]
	r = startOnPTY(t, env, "attach", "--detach-keys", "ctrl-x", "tty", id)
	r.expect("ready")
	r.send("hello\r")
	r.expect("got hello")
	if code := r.wait(); code != 0 {
		t.Errorf("attach to the end: exit %d", code)
	}

	// exec -it detaches the same way, its command left running.
	r = startOnPTY(t, env, "exec", "-it", "tty", "--", "sh", "-c", "echo ready; sleep 100")
	r.expect("ready")
	r.send("\x10\x11")
	r.expect("detached from session ")
	if code := r.wait(); code != 0 {
		t.Errorf("exec -it detach: exit %d", code)
	}
	if out, _, _ := managoatEnv(t, env, "sessions", "tty"); !regexp.MustCompile(`(?m)running\s+-\s.*sleep 100$`).MatchString(out) {
		t.Errorf("the command exec detached from does not run on:\n%s", out)
	}

	// Without -t: SIGINT to managoat goes to the command.
	c := exec.Command(binary, "exec", "tty", "--", "sh", "-c", `trap 'echo caught INT; exit 5' INT; echo ready; while :; do sleep 0.05; done`)
	c.Env = append(os.Environ(), env...)
	var o syncBuffer
	c.Stdout = &o
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(o.String(), "ready"); time.Sleep(20 * time.Millisecond) { // polling for the trap
		if time.Now().After(deadline) {
			t.Fatal("the command never became ready")
		}
	}
	if err := c.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = c.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 || !strings.Contains(o.String(), "caught INT") {
		t.Errorf("SIGINT to exec: %v, stdout %q", err, o.String())
	}
}
