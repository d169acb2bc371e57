package jail

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// Under CI the binary is built with cgo, so the C init is what runs.
func TestCInitLinked(t *testing.T) {
	testenv.Require(t, cInitLinked, "built without cgo: the C init (cinit.c) is not linked, only the Go init runs")
}

func TestProtocolRoundTrip(t *testing.T) {
	reqs := []request{
		{Ping: true},
		{Signal: 15},
		{Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"A=1", "B="}, Dir: "/tmp", KillOnClose: true},
		{Argv: []string{""}, Env: nil, Dir: "", Collect: true},
	}
	for _, r := range reqs {
		b, err := r.marshal()
		if err != nil {
			t.Fatal(err)
		}
		var got request
		if err := got.unmarshal(b); err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !slices.Equal(got.Argv, r.Argv) || !slices.Equal(got.Env, r.Env) || got.Dir != r.Dir ||
			got.KillOnClose != r.KillOnClose || got.Collect != r.Collect || got.Signal != r.Signal || got.Ping != r.Ping {
			t.Fatalf("round trip %+v -> %+v", r, got)
		}
	}
	for _, r := range []reply{{Pong: true}, {Started: true, Pid: 7}, {Error: "no", NotFound: true}, {Exited: true, Code: 137, Sig: 9}} {
		var got reply
		if err := got.unmarshal(r.marshal()); err != nil || got != r {
			t.Fatalf("round trip %+v -> %+v, %v", r, got, err)
		}
	}
	if _, err := (request{Argv: []string{strings.Repeat("x", maxPacket)}}).marshal(); err == nil {
		t.Fatal("a request over the packet limit was encoded")
	}
}

// abusePackets are malformed requests a buggy or hostile client could
// send; each must get an error reply or a closed connection, and the init
// must go on serving.
func abusePackets() map[string][]byte {
	le := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = ne.AppendUint32(b, v)
		}
		return b
	}
	spawnHdr := []byte{kindSpawn, 0, 0, 0, 0, 0, 0, 0}
	return map[string][]byte{
		"short":                 {kindSpawn, 0, 0},
		"unknown kind":          {'Z', 0, 0, 0, 0, 0, 0, 0},
		"signal before a spawn": append([]byte{kindSignal, 0, 0, 0}, le(9)...),
		"argc huge":             append(slices.Clone(spawnHdr), le(0xffffffff)...),
		"string past the end":   append(slices.Clone(spawnHdr), le(1, 1000, 'a')...),
		"no directory":          append(slices.Clone(spawnHdr), le(1, 4, 0x65757274, 0)...),
		"NUL in argv":           append(slices.Clone(spawnHdr), append(le(1, 3), append([]byte("a\x00b"), le(0, 1, '/')...)...)...),
		"trailing bytes":        append(slices.Clone(spawnHdr), le(1, 4, 0x65757274, 0, 1, '/', 99)...),
		"empty argv":            append(slices.Clone(spawnHdr), le(0, 0, 1, '/')...),
	}
}

// TestInitRefusesMalformedRequests sends every abuse packet, with and
// without descriptors, to each init, then checks it still serves.
func TestInitRefusesMalformedRequests(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j, st := startedState(t, mode, "abuse")
			ctx := context.Background()
			devnull, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer devnull.Close()
			for name, pkt := range abusePackets() {
				for _, withFDs := range []bool{false, true} {
					c, err := net.Dial("unixpacket", st.Socket)
					if err != nil {
						t.Fatalf("%s: dial: %v", name, err)
					}
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					var oob []byte
					if withFDs {
						fd := int(devnull.Fd())
						oob = unix.UnixRights(fd, fd, fd)
					}
					if _, _, err := c.(*net.UnixConn).WriteMsgUnix(pkt, oob, nil); err != nil {
						t.Fatalf("%s: send: %v", name, err)
					}
					b := make([]byte, 4096)
					n, err := c.Read(b)
					c.Close()
					if err != nil {
						continue // the init hung up: fine
					}
					var r reply
					if err := r.unmarshal(b[:n]); err != nil {
						t.Fatalf("%s (fds %v): unreadable reply %q: %v", name, withFDs, b[:n], err)
					}
					if r.Started || r.Exited || r.Pong {
						t.Fatalf("%s (fds %v): accepted: %+v", name, withFDs, r)
					}
				}
			}
			if err := ping(ctx, st.Socket); err != nil {
				t.Fatalf("the init stopped serving: %v", err)
			}
			c, err := j.Execute(ctx, "abuse", []string{"sh", "-c", "ls -l /proc/self/fd/ | grep -c -e socket: -e anon_inode; true"}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// No workload inherits the control socket, a connection, the
			// epoll or the signalfd: its only descriptors are 0, 1, 2
			// (pipes and /dev/null) and ls's own directory.
			if got := strings.TrimSpace(string(c.Stdout)); got != "0" {
				t.Fatalf("a workload holds %s of the init's sockets or anon inodes:\n%s", got, c.Stderr)
			}
		})
	}
}

// startedJail starts one sandbox with the given init (one of InitModes).
func startedJail(t *testing.T, mode, id string) *Jail {
	t.Helper()
	testenv.RequireRoot(t)
	t.Setenv(initEnv, mode)
	j, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := j.Provision(ctx, id, mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), id) })
	return j
}

// startedState is startedJail and the sandbox's state (its init's pid
// and socket).
func startedState(t *testing.T, mode, id string) (*Jail, *state) {
	t.Helper()
	j := startedJail(t, mode, id)
	st, err := readState(j.dir(id))
	if err != nil {
		t.Fatal(err)
	}
	return j, st
}

// A descriptor the manager's process holds without close-on-exec (here a
// directory of the host, as a careless parent could leave) never reaches
// a workload: with it, a workload would read the host's files.
func TestNoDescriptorLeaksIntoWorkloads(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			testenv.RequireRoot(t)
			fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0) // no O_CLOEXEC
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			const high = 77
			if err := unix.Dup2(fd, high); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(high)
			j := startedJail(t, mode, "fds")
			// ls's own descriptors: 0, 1, 2 and the directory it lists.
			got := sh(t, j, "fds", "ls -l /proc/self/fd | awk 'NR>1 {print $9, $11}'")
			for _, line := range strings.Split(got, "\n") {
				f := strings.Fields(line)
				switch {
				case len(f) == 2 && (f[0] == "0" || f[0] == "1" || f[0] == "2"):
				case len(f) == 2 && strings.HasPrefix(f[1], "/proc/") && strings.HasSuffix(f[1], "/fd"):
				default:
					t.Fatalf("a workload inherited %q:\n%s", line, got)
				}
			}
			if out := sh(t, j, "fds", "ls /proc/self/fd/77/ 2>&1 || echo gone"); !strings.HasSuffix(out, "gone") {
				t.Fatalf("descriptor 77 reached the workload: %s", out)
			}
		})
	}
}

// A command that leaves its process group (or tries to) is still killed
// by its wall-clock budget: Execute returns within the budget and a grace.
func TestWallClockKillsAGroupLeaver(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "pg")
			script := "import os, time\ntry:\n    os.setpgid(0, 1)\nexcept OSError:\n    pass\ntime.sleep(30)\n"
			began := time.Now()
			_, err := j.Execute(context.Background(), "pg", []string{"python3", "-c", script}, mechanism.ExecOptions{Timeout: time.Second})
			var le *mechanism.LimitExceededError
			if !errors.As(err, &le) || le.Limit != mechanism.LimitWallClock {
				t.Fatalf("err = %v, want LimitExceeded wall_clock", err)
			}
			if d := time.Since(began); d > 5*time.Second {
				t.Fatalf("Execute took %v with a 1 s budget", d)
			}
			if got := sh(t, j, "pg", "ps -eo args | grep -c '[t]ime.sleep' || true"); got != "0" {
				t.Fatalf("the command survived its kill: %s", got)
			}
		})
	}
}

// Requests with an empty argv and a large environment, again and again,
// leave the C init's memory where it was (the Go init's garbage is the
// collector's, and its buffers are pooled).
func TestInitDoesNotLeakOnRefusedRequests(t *testing.T) {
	modes := slices.DeleteFunc(InitModes(), func(m string) bool { return m == initGo })
	testenv.Require(t, len(modes) > 0, "no C init: built without cgo, for an architecture with no standalone init")
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			_, st := startedState(t, mode, "leak")
			rss := func() int {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(st.InitPid) + "/status")
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
						n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
						return n
					}
				}
				return 0
			}
			pkt, err := request{Argv: []string{}, Env: []string{"BIG=" + strings.Repeat("x", 100<<10)}, Dir: "/"}.marshal()
			if err != nil {
				t.Fatal(err)
			}
			devnull, _ := os.Open(os.DevNull)
			defer devnull.Close()
			fd := int(devnull.Fd())
			before := rss()
			for range 150 {
				c, err := net.Dial("unixpacket", st.Socket)
				if err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if rc, err := c.(*net.UnixConn).SyscallConn(); err == nil {
					_ = rc.Control(func(s uintptr) { _ = unix.SetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 1<<20) })
				}
				if _, _, err := c.(*net.UnixConn).WriteMsgUnix(pkt, unix.UnixRights(fd, fd, fd), nil); err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 4096)
				_, _ = c.Read(b)
				c.Close()
			}
			if after := rss(); after-before > 4<<10 {
				t.Fatalf("the %s init grew from %d to %d KiB over 150 refused requests", mode, before, after)
			}
		})
	}
}

// A command line and environment past the socket's default buffer still
// go through (one packet), up to the protocol's limit.
func TestLargeEnvironment(t *testing.T) {
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "env")
			// Three variables of 100 KiB (one string may not pass 128 KiB).
			big := strings.Repeat("y", 100<<10)
			env := []string{"A=" + big, "B=" + big, "C=" + big}
			c, err := j.Execute(context.Background(), "env", []string{"sh", "-c", "printf %s \"$A$B$C\" | wc -c"}, mechanism.ExecOptions{Env: env})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(c.Stdout)); got != strconv.Itoa(3*len(big)) {
				t.Fatalf("the command saw %s bytes, want %d", got, 3*len(big))
			}
		})
	}
}

// The host's device nodes bound into /dev are read-only mounts: the
// devices work, their nodes cannot be changed; and no workload runs as
// root.
func TestDevicesReadOnlyAndNoRootWorkload(t *testing.T) {
	if _, err := New(Config{StateDir: t.TempDir(), UID: 0, GID: 5}); err == nil {
		t.Fatal("New accepted workloads as uid 0")
	}
	j := startedJail(t, InitModes()[0], "dev")
	if got := sh(t, j, "dev", "echo x > /dev/null && head -c 4 /dev/zero | wc -c && awk '$5==\"/dev/null\"{print substr($6,1,2)}' /proc/self/mountinfo"); got != "4\nro" {
		t.Fatalf("/dev/null: %q", got)
	}
}

// The embedded standalone init is what gencinit.sh makes of the sources
// in this directory: nobody can change cinit.c or cinit_rt.c and ship a
// stale (or a different) binary. The sources' sum is checked everywhere;
// the binary is rebuilt and compared byte for byte where the compiler is
// the one that built it (the CI's).
func TestEmbeddedInitIsCurrent(t *testing.T) {
	if len(standaloneInitELF) == 0 {
		t.Skip("no standalone init for this architecture")
	}
	recorded, err := os.ReadFile("cinit_amd64.sum")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(recorded)), "\n") {
		k, v, _ := strings.Cut(line, " ")
		want[k] = v
	}
	h := sha256.New()
	for _, name := range []string{"cinit.c", "cinit_rt.c", "gencinit.sh"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want["sources"] {
		t.Fatalf("cinit_amd64.elf was built from other sources (sum %s, the sources' is %s): run go generate ./mechanism/jail", want["sources"], got)
	}
	_, err = exec.LookPath("gcc")
	testenv.Require(t, err == nil, "gcc is needed to rebuild the standalone init")
	version, err := exec.Command("gcc", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	compiler, _, _ := strings.Cut(string(version), "\n")
	if compiler != want["compiler"] && !testenv.InCI() {
		t.Skipf("built by %q, this is %q: the bytes cannot be compared", want["compiler"], compiler)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "cinit")
	if b, err := exec.Command("sh", "gencinit.sh", out, filepath.Join(dir, "sum")).CombinedOutput(); err != nil {
		t.Fatalf("gencinit.sh: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, standaloneInitELF) {
		t.Fatalf("cinit_amd64.elf (%d bytes) is not what gencinit.sh builds from the sources (%d bytes) with %s: run go generate ./mechanism/jail", len(standaloneInitELF), len(got), compiler)
	}
}
