package jail

import (
	"context"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/hostfacts"
)

// initFDs counts the init's open descriptors (read from the host).
func initFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// rawRequest sends one packet with the given descriptors and returns the
// reply ("" when the init hung up without one).
func rawRequest(t *testing.T, sock string, pkt []byte, fds []int) (reply, bool) {
	t.Helper()
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if rc, err := c.(*net.UnixConn).SyscallConn(); err == nil {
		_ = rc.Control(func(s uintptr) { _ = unix.SetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2<<20) })
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(pkt, oob, nil); err != nil {
		t.Fatalf("send: %v", err)
	}
	b := make([]byte, 4096)
	n, err := c.Read(b)
	if err != nil {
		return reply{}, false
	}
	var r reply
	if err := r.unmarshal(b[:n]); err != nil {
		t.Fatalf("unreadable reply %q: %v", b[:n], err)
	}
	return r, true
}

// Requests a buggy or hostile client could send that the malformed-packet
// test does not: too many descriptors (more than the init's control
// buffer holds: the kernel truncates), descriptors of every kind, names
// and directories far past the init's buffers, format directives in
// names, a directory the workload's uid cannot enter (the vfork child
// fails after it began). Every init refuses each with an error reply, keeps
// no descriptor, and goes on serving.
func TestInitHostileRequests(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j, st := startedState(t, mode, "hostile")
			devnull, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer devnull.Close()
			dn := int(devnull.Fd())
			ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(ep)
			three := []int{dn, dn, dn}
			many := make([]int, 40)
			for i := range many {
				many[i] = dn
			}
			spawn := func(argv, env []string, dir string) []byte {
				b, err := request{Argv: argv, Env: env, Dir: dir, Collect: true}.marshal()
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			long := "/" + strings.Repeat("a", 8000)
			manyPath := "PATH=" + strings.Repeat(":rel", 20000) + ":" + strings.Repeat("x", 5000)
			cases := []struct {
				name string
				pkt  []byte
				fds  []int
				want string // in the error
			}{
				{"forty descriptors", spawn([]string{"/bin/true"}, nil, "/"), many, ""},
				{"eight descriptors", spawn([]string{"/bin/true"}, nil, "/"), many[:8], ""},
				{"epoll as stdin", spawn([]string{long}, nil, "/"), []int{ep, dn, dn}, ""},
				{"ping with descriptors", []byte{kindPing, 0, 0, 0, 0, 0, 0, 0}, many, ""},
				{"long absolute name", spawn([]string{long}, nil, "/"), three, "executable"},
				{"long relative name", spawn([]string{"a/" + long}, nil, long), three, "working directory"},
				{"long directory", spawn([]string{"true"}, nil, "/"+strings.Repeat("d", 300<<10)), three, "working directory"},
				{"long PATH", spawn([]string{"nosuchcommand"}, []string{manyPath}, "/"), three, "not found in PATH"},
				{"format directives", spawn([]string{"%s%s%n%.*s%99999d"}, []string{"PATH=%n:%s"}, "/"), three, "%s%s%n%.*s%99999d"},
				{"directory the workload cannot enter", spawn([]string{"/bin/true"}, nil, "/proc/1/fd"), three, "permission denied"},
			}
			base := initFDs(t, st.InitPid)
			for _, c := range cases {
				r, ok := rawRequest(t, st.Socket, c.pkt, c.fds)
				if ok && (r.Started || r.Exited || (r.Pong && c.name != "ping with descriptors")) {
					t.Errorf("%s: accepted: %+v", c.name, r)
				}
				if c.want != "" && (!ok || !strings.Contains(strings.ToLower(r.Error), strings.ToLower(c.want))) {
					t.Errorf("%s: error %.80q (replied %v), want an error with %q", c.name, r.Error, ok, c.want)
				}
				if len(r.Error) > 4096 {
					t.Errorf("%s: a %d-byte error", c.name, len(r.Error))
				}
				if err := ping(context.Background(), st.Socket); err != nil {
					t.Fatalf("%s: the init stopped serving: %v", c.name, err)
				}
			}
			// The init holds what it held before (connections close
			// asynchronously: poll).
			deadline := time.Now().Add(5 * time.Second)
			for initFDs(t, st.InitPid) > base {
				if time.Now().After(deadline) {
					t.Fatalf("the init holds %d descriptors, %d before the requests", initFDs(t, st.InitPid), base)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := sh(t, j, "hostile", "echo fine"); got != "fine" {
				t.Fatalf("after the requests: %q", got)
			}
		})
	}
}

// A workload controls its own exit status, its signals and its
// children: none of that confuses the init. A command killed by signal
// 64, one that leaves 200 exited children (orphans the init reaps) behind
// it, and one that closes its descriptors and stops itself before it is
// killed are each reported as they ended, by every init.
func TestInitHostileWorkloads(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "wl")
			ctx := context.Background()
			run := func(script string, timeout time.Duration) (mechanism.Completion, error) {
				return j.Execute(ctx, "wl", []string{"python3", "-c", script}, mechanism.ExecOptions{Timeout: timeout})
			}
			c, err := run("import os\nos.kill(os.getpid(), 64)", 0)
			if err != nil || c.ExitStatus != 128+64 {
				t.Fatalf("signal 64: %+v, %v", c, err)
			}
			c, err = run("import os\nfor i in range(200):\n    if os.fork() == 0:\n        os._exit(3)\nos._exit(5)", 0)
			if err != nil || c.ExitStatus != 5 {
				t.Fatalf("200 orphans: %+v, %v", c, err)
			}
			// i386 system calls (int $0x80) meet the deny-list in their
			// own numbers: getpid runs, a personality query is refused
			// (outside a sandbox it answers 0). Without IA32 emulation
			// (hostfacts.IA32) the first int $0x80 ends the workload
			// (SIGSEGV; SIGSYS under internal/ia32off) before any call
			// returns.
			if runtime.GOARCH == "amd64" {
				c, err = run(int80Script, 0)
				if hostfacts.Has(hostfacts.IA32) {
					if err != nil || c.ExitStatus != 0 || !strings.Contains(string(c.Stdout), "i386 personality answered -1\n") ||
						strings.Contains(string(c.Stdout), "i386 getpid answered -") {
						t.Fatalf("i386 system calls: %+v (stdout %q), %v", c, c.Stdout, err)
					}
				} else if err != nil || (c.ExitStatus != 128+int(syscall.SIGSEGV) && c.ExitStatus != 128+int(syscall.SIGSYS)) || strings.Contains(string(c.Stdout), "answered") {
					t.Fatalf("i386 system calls without IA32 emulation: %+v (stdout %q), %v; want the workload ended by SIGSEGV or SIGSYS", c, c.Stdout, err)
				}
			}
			began := time.Now()
			_, err = run("import os, signal\nfor fd in (0, 1, 2):\n    os.close(fd)\nos.kill(os.getpid(), signal.SIGSTOP)", time.Second)
			if err == nil || time.Since(began) > 10*time.Second {
				t.Fatalf("a stopped command: %v after %v", err, time.Since(began))
			}
			if got := sh(t, j, "wl", "ps -eo stat= | grep -c Z || true"); got != "0" {
				t.Fatalf("zombies left: %s", got)
			}
		})
	}
}

// int80Script runs, from executable pages, i386's getpid (mov eax, 20;
// int $0x80; ret) and a personality query (push rbx; mov ebx, -1;
// mov eax, 136; int $0x80; pop rbx; ret) through the compatibility
// interface, and prints what each returned as a 32-bit number: -1 is
// EPERM.
const int80Script = `import ctypes, mmap
def call(code):
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(bytes(code))
    f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    return ctypes.c_int32(f()).value
print("i386 getpid answered", call([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))
print("i386 personality answered", call([0x53, 0xbb, 0xff, 0xff, 0xff, 0xff, 0xb8, 0x88, 0, 0, 0, 0xcd, 0x80, 0x5b, 0xc3]))
`
