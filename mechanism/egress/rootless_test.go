package egress_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// agentEnv makes the test binary a rootless sandbox's stand-in: a
// process born in a user and a network namespace of its own (only lo,
// down) that opens connections from inside for the test.
const agentEnv = "MANAGOAT_EGRESS_TEST_AGENT"

// agent is such a process, asked over a socket pair: "network address"
// is answered "OK" with the connected socket, or "ERR errno message".
type agent struct {
	cmd  *exec.Cmd
	sock *os.File
}

func startAgent(t testing.TB) *agent {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "agent"), os.NewFile(uintptr(pair[1]), "agent")
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{agentEnv + "=1"}
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := cmd.Start(); err != nil {
		ours.Close()
		theirs.Close()
		t.Fatalf("start a process in a user namespace of its own: %v", err)
	}
	theirs.Close()
	a := &agent{cmd: cmd, sock: ours}
	t.Cleanup(func() {
		a.sock.Close() // the agent exits when its end reads EOF
		_ = a.cmd.Wait()
	})
	return a
}

func (a *agent) dial(network, addr string) (net.Conn, error) {
	f, err := a.ask(network + " " + addr)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileConn(f)
}

// listen listens on addr inside.
func (a *agent) listen(addr string) (net.Listener, error) {
	f, err := a.ask("listen tcp4 " + addr)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileListener(f)
}

func (a *agent) ask(req string) (*os.File, error) {
	network, addr, _ := strings.Cut(req, " ")
	fd := int(a.sock.Fd())
	if _, err := unix.Write(fd, []byte(req)); err != nil {
		return nil, err
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	msg := string(buf[:n])
	if rest, ok := strings.CutPrefix(msg, "ERR "); ok {
		num, text, _ := strings.Cut(rest, " ")
		e, _ := strconv.Atoi(num)
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError(text, syscall.Errno(e))}
	}
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cms) != 1 {
		return nil, fmt.Errorf("agent: answer %q without a socket", msg)
	}
	fds, err := unix.ParseUnixRights(&cms[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("agent: answer %q: %v", msg, err)
	}
	return os.NewFile(uintptr(fds[0]), addr), nil
}

// agentMain serves dial requests on fd 3 until it reads EOF.
func agentMain() int {
	const fd = 3
	buf := make([]byte, 512)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n == 0 {
			return 0
		}
		network, addr, _ := strings.Cut(string(buf[:n]), " ")
		if network == "listen" { // "listen tcp4 address": a listener's descriptor
			network, addr, _ = strings.Cut(addr, " ")
			ln, err := net.Listen(network, addr)
			if err != nil {
				if _, err := unix.Write(fd, []byte("ERR 0 listen")); err != nil {
					return 1
				}
				continue
			}
			f, _ := ln.(*net.TCPListener).File()
			serr := unix.Sendmsg(fd, []byte("OK"), unix.UnixRights(int(f.Fd())), nil, 0)
			f.Close()
			ln.Close()
			if serr != nil {
				return 1
			}
			continue
		}
		c, err := net.DialTimeout(network, addr, 3*time.Second)
		if err != nil {
			var errno syscall.Errno
			errors.As(err, &errno)
			msg := fmt.Sprintf("ERR %d connect", int(errno))
			if _, err := unix.Write(fd, []byte(msg)); err != nil {
				return 1
			}
			continue
		}
		rc, _ := c.(syscall.Conn).SyscallConn()
		var serr error
		_ = rc.Control(func(s uintptr) { serr = unix.Sendmsg(fd, []byte("OK"), unix.UnixRights(int(s)), nil, 0) })
		c.Close()
		if serr != nil {
			return 1
		}
	}
}

// rootlessBox is a sandbox of an unprivileged manager: an agent in its
// own user namespace, given egress by egress.Attach without root.
func rootlessBox(t *testing.T, in *egresstest.Internet, allow []string) *box {
	t.Helper()
	a := startAgent(t)
	var pol *egress.Policy
	if allow != nil {
		var err error
		if pol, err = egress.ParsePolicy(allow); err != nil {
			t.Fatal(err)
		}
	}
	p, err := egress.Attach(a.cmd.Process.Pid, pol, egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}})
	if err != nil {
		t.Fatalf("rootless Attach: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return &box{t: t, in: in, ns: -1, p: p, agent: a}
}

// TestRootless: a manager that is not root (uid 65534) gives a sandbox
// in a user namespace it made the same egress as root does: the outside
// world by name through the sandbox's resolver, never the host's
// loopback and addresses, link-local or private ranges; under a list
// only what it allows (a raw IP, a forged SNI or Host, an outside
// resolver refused); a policy change cuts the connections it denies.
func TestRootless(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	if os.Geteuid() == 0 {
		t.Fatal("running as root")
	}
	res := egress.ResolverAddr + ":53"
	b := rootlessBox(t, in, nil)
	addrs, rcode, err := b.resolve(res, egresstest.Allowed)
	if err != nil || rcode != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != egresstest.Hosts[egresstest.Allowed] {
		t.Fatalf("resolve through the sandbox's resolver = %v %d %v", addrs, rcode, err)
	}
	mustReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	mustReach(t, b, ip(egresstest.Denied)+":443", egresstest.Denied, egresstest.Denied)
	t.Run("Forbidden", func(t *testing.T) {
		ln, targets := hostListener(t)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		targets = append(targets, "127.0.0.1:"+port, "169.254.169.254:80", "10.0.0.1:80", "192.168.1.1:80")
		for _, a := range targets {
			refusedAtConnect(t, b, a)
		}
	})
	t.Run("AnotherSandbox", func(t *testing.T) {
		other := rootlessBox(t, in, nil)
		ln, err := other.agent.listen("0.0.0.0:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("hello from the other sandbox\n"))
				c.Close()
			}
		}()
		// The control: the other sandbox reaches its own listener.
		if c, err := other.dial("127.0.0.1:8080"); err != nil {
			t.Fatalf("the other sandbox's own listener: %v", err)
		} else {
			c.Close()
		}
		for _, addr := range []string{"127.0.0.1:8080", "10.0.2.15:8080"} {
			c, err := b.dial(addr)
			if err != nil {
				t.Logf("%s: %v", addr, err)
				continue
			}
			c.SetDeadline(time.Now().Add(2 * time.Second))
			got, _ := io.ReadAll(c)
			c.Close()
			if strings.Contains(string(got), "other sandbox") {
				t.Errorf("BREACHED: a sandbox reached another at %s", addr)
			}
		}
	})
	t.Run("Policy", func(t *testing.T) {
		b := rootlessBox(t, in, []string{egresstest.Allowed})
		if _, rc, err := b.resolve(res, egresstest.Denied); err != nil || rc != dns.RcodeRefused {
			t.Errorf("resolve a denied name = %d, %v; want REFUSED", rc, err)
		}
		// Not resolved yet: the address alone allows nothing (reset by
		// the proxy: the packet filter is the one without a policy).
		mustNotReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Allowed, egresstest.Allowed)
		if _, rc, err := b.resolve(res, egresstest.Allowed); err != nil || rc != dns.RcodeSuccess {
			t.Fatalf("resolve an allowed name = %d, %v", rc, err)
		}
		mustReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Allowed, egresstest.Allowed)
		mustReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
		mustNotReach(t, b, ip(egresstest.Denied)+":443", egresstest.Denied, egresstest.Denied)   // raw IP
		mustNotReach(t, b, ip(egresstest.Denied)+":443", egresstest.Allowed, egresstest.Allowed) // forged SNI
		mustNotReach(t, b, ip(egresstest.Denied)+":80", egresstest.Allowed, "")                  // forged Host
		mustNotReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Denied, egresstest.Denied)
		if _, _, err := b.resolve(egresstest.Resolver, egresstest.Denied); err == nil {
			t.Errorf("BREACHED: UDP DNS to an outside resolver answered")
		}
		if c, err := b.dial(egresstest.Resolver); err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			q := new(dns.Msg)
			q.SetQuestion(dns.Fqdn(egresstest.Denied), dns.TypeA)
			dc := &dns.Conn{Conn: c}
			if dc.WriteMsg(q) == nil {
				if r, err := dc.ReadMsg(); err == nil {
					t.Errorf("BREACHED: TCP DNS to an outside resolver answered %v", r.Answer)
				}
			}
			c.Close()
		}
		refusedAtConnect(t, b, "169.254.169.254:80")
	})
	t.Run("PolicyChangeCuts", func(t *testing.T) {
		kept := echo(t, b, ip(egresstest.Denied)+":7")
		defer kept.Close()
		cut := echo(t, b, ip(egresstest.Allowed)+":7")
		defer cut.Close()
		pol, _ := egress.ParsePolicy([]string{"203.0.113.0/24"})
		if n, err := b.p.SetPolicy(pol); err != nil || n != 1 {
			t.Errorf("SetPolicy cut %d, %v; want 1", n, err)
		}
		cut.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := cut.Write([]byte("ping\n")); err == nil {
			buf := make([]byte, 5)
			if n, err := io.ReadFull(cut, buf); err == nil {
				t.Errorf("BREACHED: a connection the new policy denies still carries data (%q)", buf[:n])
			}
		}
		kept.SetDeadline(time.Now().Add(2 * time.Second))
		kept.Write([]byte("ping\n"))
		buf := make([]byte, 5)
		if _, err := io.ReadFull(kept, buf); err != nil {
			t.Errorf("a connection the new policy allows was cut: %v", err)
		}
		mustNotReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
		empty, _ := egress.ParsePolicy([]string{})
		b.p.SetPolicy(empty)
		mustNotReach(t, b, ip(egresstest.Denied)+":80", egresstest.Denied, "")
	})
}
