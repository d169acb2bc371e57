package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Rootless egress (a sandbox in a user namespace its unprivileged manager
// made, see the package doc). A Go process cannot join a user namespace
// (setns refuses a multithreaded caller), so a single-threaded program
// joins the sandbox's user and network namespaces first and executes
// this binary there: util-linux's nsenter (Essential in Debian). The
// binary, owning the namespace's capabilities, sets it up as Attach does
// as root (lo, the default route, the packet filter, the proxy's
// sockets), sends the sockets back over a socket pair (SCM_RIGHTS) and
// exits. The packet filter it leaves is the one without a policy (every
// TCP connection to the proxy, forbidden destinations refused at
// connect): nobody stays in the namespace to change it, so a policy is
// enforced by the proxy alone.

// netnsHelperEnv selects the helper role of an executed binary; its
// value is the descriptor of the socket pair's end.
const netnsHelperEnv = "MANAGOAT_EGRESS_NETNS_HELPER"

// nsenterPaths are where nsenter is looked for (PATH first).
var nsenterPaths = []string{"/usr/bin/nsenter", "/bin/nsenter"}

// init takes the helper role before main runs, in a binary this package
// executed in a sandbox's namespaces: it never returns there.
func init() {
	if v := os.Getenv(netnsHelperEnv); v != "" {
		os.Exit(netnsHelper(v))
	}
}

// helperReq is what the manager sends the helper; helperRep what it
// answers, with the proxy's TCP listener, the resolver's UDP socket and
// TCP listener as descriptors.
type helperReq struct {
	Denied []netip.Prefix `json:"denied"`
}

type helperRep struct {
	Port  uint16 `json:"port"`
	Error string `json:"error,omitempty"`
}

// nsenterPath is nsenter's path, or "".
func nsenterPath() string {
	if p, err := exec.LookPath("nsenter"); err == nil {
		return p
	}
	for _, p := range nsenterPaths {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// RootlessSupported reports whether an unprivileged process can give
// sandboxes in its own user namespaces egress here (util-linux's nsenter
// is installed), and if not, why.
func RootlessSupported() (bool, string) {
	if nsenterPath() == "" {
		return false, "rootless egress needs nsenter (Debian package util-linux) to enter the sandbox's user namespace"
	}
	return true, ""
}

// attachRootless sets up the network namespace of pid, a process in a
// user namespace this process's user owns, through a helper executed
// there, and returns its sockets as a namespace.
func attachRootless(pid int, allowPrivate bool) (*namespace, error) {
	nsenter := nsenterPath()
	if nsenter == "" {
		_, why := RootlessSupported()
		return nil, errors.New(why)
	}
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours := os.NewFile(uintptr(pair[0]), "egress helper")
	theirs := os.NewFile(uintptr(pair[1]), "egress helper")
	defer ours.Close()
	// The helper's end is its fd 3, the binary its fd 4.
	cmd := exec.Command(nsenter, "--target", strconv.Itoa(pid), "--user", "--net", "--preserve-credentials",
		"--", "/proc/self/fd/4")
	cmd.Env = []string{netnsHelperEnv + "=3", "GOMAXPROCS=1"}
	cmd.ExtraFiles = []*os.File{theirs, exe}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		theirs.Close()
		return nil, fmt.Errorf("start the egress helper: %w", err)
	}
	theirs.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ns, err := talkToHelper(ours, deniedPrefixes(allowPrivate))
	if err != nil {
		_ = cmd.Process.Kill()
	}
	werr := <-done
	if err == nil && werr != nil {
		ns.close()
		err = werr
	}
	if err != nil {
		if s := strings.TrimSpace(stderr.String()); s != "" {
			err = fmt.Errorf("%w: %s", err, s)
		}
		return nil, fmt.Errorf("egress helper in the namespaces of %d: %w", pid, err)
	}
	return ns, nil
}

// talkToHelper sends the request and receives the sockets.
func talkToHelper(f *os.File, denied []netip.Prefix) (*namespace, error) {
	b, _ := json.Marshal(helperReq{Denied: denied})
	fd := int(f.Fd())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 20})
	if _, err := unix.Write(fd, b); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	closeAll := func() {
		for _, x := range fds {
			unix.Close(x)
		}
	}
	if n == 0 {
		closeAll()
		return nil, errors.New("the helper ended without an answer")
	}
	var rep helperRep
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		closeAll()
		return nil, err
	}
	if rep.Error != "" {
		closeAll()
		return nil, errors.New(rep.Error)
	}
	if len(fds) != 3 {
		closeAll()
		return nil, fmt.Errorf("the helper sent %d sockets, want 3", len(fds))
	}
	ns := &namespace{nsfd: -1, port: rep.Port}
	var lerr error
	ns.tcp, lerr = fileTCPListener(fds[0])
	if lerr == nil {
		ns.dnsUDP, lerr = fileUDPConn(fds[1])
	} else {
		unix.Close(fds[1])
	}
	if lerr == nil {
		ns.dnsTCP, lerr = fileTCPListener(fds[2])
	} else {
		unix.Close(fds[2])
	}
	if lerr != nil {
		ns.close()
		return nil, lerr
	}
	return ns, nil
}

func fileTCPListener(fd int) (*net.TCPListener, error) {
	f := os.NewFile(uintptr(fd), "egress listener")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	tl, ok := l.(*net.TCPListener)
	if !ok {
		l.Close()
		return nil, errors.New("not a TCP listener")
	}
	return tl, nil
}

func fileUDPConn(fd int) (*net.UDPConn, error) {
	f := os.NewFile(uintptr(fd), "egress resolver")
	defer f.Close()
	c, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UDPConn)
	if !ok {
		c.Close()
		return nil, errors.New("not a UDP socket")
	}
	return uc, nil
}

// netnsHelper is the helper's work, in the sandbox's user and network
// namespaces (the whole process), with the socket pair's end at fd v.
func netnsHelper(v string) int {
	fd, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, "egress helper: bad descriptor", v)
		return 2
	}
	answer := func(rep helperRep, fds []int) int {
		b, _ := json.Marshal(rep)
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		if err := unix.Sendmsg(fd, b, oob, nil, 0); err != nil {
			fmt.Fprintln(os.Stderr, "egress helper: answer:", err)
			return 1
		}
		return 0
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 20})
	buf := make([]byte, 1<<20)
	n, err := unix.Read(fd, buf)
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "egress helper: read the request:", err)
		return 1
	}
	var req helperReq
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		return answer(helperRep{Error: "bad request: " + err.Error()}, nil)
	}
	ns := &namespace{nsfd: -1}
	defer ns.close()
	if err := ns.setup(req.Denied); err != nil {
		return answer(helperRep{Error: err.Error()}, nil)
	}
	var fds []int
	for _, c := range []syscall.Conn{ns.tcp, ns.dnsUDP, ns.dnsTCP} {
		rc, err := c.SyscallConn()
		if err != nil {
			return answer(helperRep{Error: err.Error()}, nil)
		}
		_ = rc.Control(func(s uintptr) { fds = append(fds, int(s)) })
	}
	return answer(helperRep{Port: ns.port}, fds)
}
