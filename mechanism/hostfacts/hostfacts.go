// Package hostfacts lists, in one place, the kernel features that differ
// between supported Linux hosts by configuration rather than by what is
// installed: whether i386 system calls run at all (IA32 emulation), which
// cgroup freezer exists, KVM, the Landlock ABI, user namespaces, the
// procfs pidns option and where the cgroup limits live. Each Fact says
// whether the feature is present, the evidence, and what in managoat (and
// in its tests) takes another path without it.
//
// A missing package or root is a prerequisite (a test fails under CI=true
// without it, see internal/testenv); a fact is not: a host may lack it by
// configuration, and a test that depends on one proves what it can on this
// host and the rest another way. `managoat doctor --json` reports every
// fact under "facts".
//
// The i386 probe makes an i386 system call (int $0x80), which faults when
// the kernel has no IA32 emulation; it therefore runs in a child process,
// this binary started again with a role this package's init recognises
// and ends before main runs, so no hook is needed and a program's main is
// never run twice.
package hostfacts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// Name names a fact.
type Name string

// The facts. Affects in each Fact says what depends on it.
const (
	// IA32: the kernel runs i386 system calls (int $0x80) of x86-64
	// processes. Off (ia32_emulation=false, or a kernel built without
	// it), int $0x80 faults and no i386 call can run, so none can escape.
	IA32 Name = "ia32"
	// FreezerV2: this process's cgroup2 directory has cgroup.freeze.
	FreezerV2 Name = "freezer_v2"
	// FreezerV1: a cgroup v1 freezer hierarchy is mounted.
	FreezerV1 Name = "freezer_v1"
	// KVM: /dev/kvm opens for reading and writing.
	KVM Name = "kvm"
	// Landlock: the kernel answers a Landlock ABI version; Value is it.
	Landlock Name = "landlock"
	// UserNS: this process can make a user namespace.
	UserNS Name = "userns"
	// ProcPidns: procfs takes the pidns mount option (Linux 6.18).
	ProcPidns Name = "procfs_pidns"
	// CgroupV2Limits: the unified tree offers memory, pids and cpu to this
	// process's cgroup (pure v2); absent, limits live in v1 (hybrid).
	CgroupV2Limits Name = "cgroup_v2_limits"
)

// Names lists every fact, in the order All reports them.
func Names() []Name {
	return []Name{IA32, FreezerV2, FreezerV1, KVM, Landlock, UserNS, ProcPidns, CgroupV2Limits}
}

// affects says, per fact, what takes another path without it.
var affects = map[Name]string{
	IA32: "without it no i386 system call runs, so none can pass the seccomp filter: " +
		"seccompbpf.TestJailProgramFilters and jail.TestInitHostileWorkloads then check that int $0x80 ends its process " +
		"instead of trying each i386 call in the kernel; seccompbpf.TestProgramsI386 checks the filters' i386 half in a " +
		"userspace BPF interpreter on every host",
	FreezerV2: "suspend freezes a sandbox with cgroup.freeze; without it, SIGSTOP to each process of its cgroups " +
		"(cgroups.TestFreeze runs whichever exists, mechanismtest's freeze check either way)",
	FreezerV1:      "not used: managoat never needs the v1 freezer; reported because hosts differ in it",
	KVM:            "not used: no mechanism here needs a KVM guest; reported for the doctor",
	Landlock:       "the jail confines the file system with the rights of the ABI it finds (a lower ABI handles fewer rights); without Landlock the jail refuses to start",
	UserNS:         "the rootless jail (not root) needs it; as root the jail does not",
	ProcPidns:      "the jail's init is born restricted, and tree templates serve, only with it (jail.TestTemplate* need it); without it the init restricts itself after start",
	CgroupV2Limits: "limits are written to the unified tree; without it to the v1 hierarchies (hybrid hosts)",
}

// Fact is one feature of this host.
type Fact struct {
	Name    Name   `json:"name"`
	Present bool   `json:"present"`
	Value   string `json:"value,omitempty"` // Landlock's ABI version
	Detail  string `json:"detail"`          // the evidence
	Affects string `json:"affects"`
}

// Role is the environment variable that makes this binary, started again
// by the IA32 probe, make one i386 system call and exit before main.
const Role = "MANAGOAT_HOSTFACTS_PROBE"

func init() {
	if os.Getenv(Role) != "" {
		runRole(os.Getenv(Role))
	}
}

var (
	once  sync.Once
	facts []Fact
)

// All probes every fact once per process and returns them in Names()
// order.
func All() []Fact {
	once.Do(func() {
		for _, n := range Names() {
			f := probe(n)
			f.Name, f.Affects = n, affects[n]
			facts = append(facts, f)
		}
	})
	return append([]Fact(nil), facts...)
}

// Get returns the fact called n (a zero Fact for an unknown name).
func Get(n Name) Fact {
	for _, f := range All() {
		if f.Name == n {
			return f
		}
	}
	return Fact{Name: n, Detail: "unknown fact"}
}

// Has reports whether fact n is present on this host.
func Has(n Name) bool { return Get(n).Present }

func probe(n Name) Fact {
	switch n {
	case IA32:
		return probeIA32()
	case FreezerV2:
		l, err := cgroups.Detect()
		if err != nil || l.V2 == "" {
			return Fact{Detail: fmt.Sprintf("no cgroup2 directory for this process (%v)", err)}
		}
		if _, err := os.Stat(l.V2 + "/cgroup.freeze"); err == nil {
			return Fact{Present: true, Detail: l.V2 + "/cgroup.freeze exists"}
		}
		// The root of the tree never has cgroup.freeze: ask a child of
		// it, which is how the sandboxes' groups will be made.
		if _, err := os.Stat(l.V2 + "/cgroup.subtree_control"); err == nil && isRoot() {
			return Fact{Present: true, Detail: l.V2 + " is the cgroup2 root: every child has cgroup.freeze"}
		}
		return Fact{Detail: l.V2 + " has no cgroup.freeze (kernel before 5.2)"}
	case FreezerV1:
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			return Fact{Detail: err.Error()}
		}
		for _, line := range strings.Split(string(b), "\n") {
			if p := strings.SplitN(line, ":", 3); len(p) == 3 && hasWord(p[1], "freezer") {
				return Fact{Present: true, Detail: "/proc/self/cgroup: " + line}
			}
		}
		return Fact{Detail: "/proc/self/cgroup names no freezer hierarchy"}
	case KVM:
		fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return Fact{Detail: "open /dev/kvm: " + err.Error()}
		}
		unix.Close(fd)
		return Fact{Present: true, Detail: "/dev/kvm opens read-write"}
	case Landlock:
		abi, err := ll.LandlockGetABIVersion()
		if err != nil {
			return Fact{Detail: fmt.Sprintf("landlock ABI query: %v (ENOSYS: not built; EOPNOTSUPP: disabled at boot)", err)}
		}
		return Fact{Present: abi > 0, Value: strconv.Itoa(abi), Detail: fmt.Sprintf("Landlock ABI %d", abi)}
	case UserNS:
		return probeUserNS()
	case ProcPidns:
		if err := mechanism.ProcPidnsOption(); err != nil {
			return Fact{Detail: err.Error() + " (Linux before 6.18, or no CAP_SYS_ADMIN)"}
		}
		return Fact{Present: true, Detail: "procfs takes the pidns option"}
	case CgroupV2Limits:
		l, err := cgroups.Detect()
		if err != nil {
			return Fact{Detail: err.Error()}
		}
		var missing []string
		for _, c := range []string{"memory", "pids", "cpu"} {
			if !hasWord(strings.Join(l.V2Controllers, ","), c) {
				missing = append(missing, c)
			}
		}
		if l.V2 == "" || len(missing) > 0 {
			return Fact{Detail: fmt.Sprintf("cgroup mode %s; the unified tree lacks %v here", l.Mode, missing)}
		}
		return Fact{Present: true, Detail: fmt.Sprintf("cgroup mode %s; %s offers %v", l.Mode, l.V2, l.V2Controllers)}
	}
	return Fact{Detail: "unknown fact"}
}

func hasWord(list, w string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == w {
			return true
		}
	}
	return false
}

// isRoot reports whether this process's cgroup2 directory is the root of
// the tree (whose own cgroup.freeze does not exist).
func isRoot() bool {
	b, err := os.ReadFile("/proc/self/cgroup")
	return err == nil && strings.Contains(string(b), "0::/\n")
}

func probeUserNS() Fact {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
	if err := cmd.Run(); err != nil {
		detail := "clone a user namespace: " + err.Error()
		if b, e := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); e == nil && strings.TrimSpace(string(b)) == "0" {
			detail += " (kernel.unprivileged_userns_clone=0)"
		}
		if b, e := os.ReadFile("/proc/sys/user/max_user_namespaces"); e == nil && strings.TrimSpace(string(b)) == "0" {
			detail += " (user.max_user_namespaces=0)"
		}
		return Fact{Detail: detail}
	}
	return Fact{Present: true, Detail: "/bin/true ran in a new user namespace"}
}

// I386Outcome is what one i386 system call did in a child process.
type I386Outcome struct {
	// Ran: the call returned; Result is what it returned (a 32-bit value,
	// -errno on failure).
	Ran    bool
	Result int32
	// Signal ended the child before the call returned (SIGSEGV: no IA32
	// emulation; SIGSYS: a seccomp filter that kills).
	Signal syscall.Signal
	Err    error // the child could not be started or said something else
}

// TryI386 makes i386 system call nr (i386's numbering) with up to three
// arguments in a child process: this binary started again with Role, so
// that a fault ends the child, never the caller. seccompProg, when not
// nil, is loaded first (no_new_privs, then seccomp) so that a filter's
// answer to the call is seen.
func TryI386(ctx context.Context, nr uint32, args [3]uint32, seccompProg []unix.SockFilter) I386Outcome {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return I386Outcome{Err: errors.New("i386 system calls exist only on x86-64")}
	}
	exe, err := os.Executable()
	if err != nil {
		return I386Outcome{Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	if _, err := os.Stat("/proc/self/exe"); err != nil {
		cmd = exec.CommandContext(ctx, exe)
	}
	cmd.Args[0] = exe
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=i386 %d %d %d %d", Role, nr, args[0], args[1], args[2]))
	if seccompProg != nil {
		var b strings.Builder
		for _, f := range seccompProg {
			fmt.Fprintf(&b, "%d,%d,%d,%d;", f.Code, f.Jt, f.Jf, f.K)
		}
		cmd.Env = append(cmd.Env, roleFilter+"="+b.String())
	}
	cmd.Stdin, cmd.Stderr = nil, nil
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return I386Outcome{Signal: ws.Signal()}
		}
		return I386Outcome{Err: fmt.Errorf("i386 probe: %v: %s", err, strings.TrimSpace(string(out)))}
	}
	if err != nil {
		return I386Outcome{Err: fmt.Errorf("i386 probe: %w", err)}
	}
	var r int32
	if _, err := fmt.Sscanf(string(out), "returned %d\n", &r); err != nil {
		return I386Outcome{Err: fmt.Errorf("i386 probe said %q", out)}
	}
	return I386Outcome{Ran: true, Result: r}
}

const roleFilter = "MANAGOAT_HOSTFACTS_FILTER"

func probeIA32() Fact {
	if runtime.GOARCH != "amd64" {
		return Fact{Detail: "not x86-64: there is no i386 interface"}
	}
	o := TryI386(context.Background(), 20, [3]uint32{}, nil) // getpid
	switch {
	case o.Ran && o.Result > 0:
		return Fact{Present: true, Detail: fmt.Sprintf("i386 getpid (int $0x80) answered %d in a child", o.Result)}
	case o.Ran:
		return Fact{Detail: fmt.Sprintf("i386 getpid answered %d", o.Result)}
	case o.Signal != 0:
		why := "IA32 emulation is off"
		if o.Signal == syscall.SIGSYS {
			why = "a seccomp filter this process inherited kills i386 calls, as when IA32 emulation is off"
		}
		return Fact{Detail: fmt.Sprintf("int $0x80 ended its process with %v: %s", o.Signal, why)}
	}
	return Fact{Detail: "not probed: " + o.Err.Error()}
}
