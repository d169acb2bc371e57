package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Published relays the connections made to a published port on this
// host to a port on a sandbox's own loopback: how an application served
// inside a sandbox is reached from this machine. It listens in two
// places, neither of which another machine, or another user of this one,
// can use:
//
//   - a unix socket, mode 0600 in a directory of this user's, mode 0700
//     (PortsDir; Socket): what `managoat serve` proxies, behind its API
//     keys; no other user can connect(2) to it at all;
//   - a TCP port of 127.0.0.1 (Addr), for this user's own tools (a
//     browser, curl: `managoat url`): a connection is relayed only when
//     the socket at its other end belongs to this user (or root), which
//     the kernel says (sock_diag, the socket's owner uid); any other
//     user's connection is reset before a byte is read or relayed.
type Published struct {
	ln    *net.TCPListener
	sock  *net.UnixListener // nil where PortsDir is unusable
	d     portDialer
	ownsD bool // Close closes d (Publish's; PublishPorts' Ports close theirs)
	port  int
	owner uint32 // the uid whose connections to ln are relayed (and root's)
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// Publish publishes port of the sandbox whose init is pid on a free port
// of 127.0.0.1 and on a unix socket (see Published). As root it enters
// the sandbox's network namespace for each connection; as another user
// pid must be in a user namespace this user owns (a rootless sandbox),
// where a helper makes the sockets (see the package doc's Rootless).
func Publish(pid, port int) (*Published, error) {
	if err := checkPort(port); err != nil {
		return nil, err
	}
	d, err := newPortDialer(pid)
	if err != nil {
		return nil, err
	}
	p, err := publishWith(d, port)
	if err != nil {
		d.close()
		return nil, err
	}
	p.ownsD = true
	return p, nil
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d is not 1 to 65535", port)
	}
	return nil
}

// dialTimeout bounds a connection to a published port inside the sandbox.
const dialTimeout = 5 * time.Second

// portDialer connects to a port on a sandbox's loopback.
type portDialer interface {
	dialPort(port int) (net.Conn, error)
	close()
}

// newPortDialer is the portDialer for the sandbox whose init is pid: as
// root its network namespace, entered per connection; otherwise a socket
// helper in its namespaces (publish_rootless.go).
func newPortDialer(pid int) (portDialer, error) {
	if os.Geteuid() != 0 {
		return startSocketFactory(pid)
	}
	fd, err := openPidNetns(pid)
	if err != nil {
		return nil, err
	}
	return netnsDialer(fd), nil
}

// netnsDialer is a network namespace's descriptor (root).
type netnsDialer int

func (d netnsDialer) dialPort(port int) (c net.Conn, err error) {
	err = onThreadIn(int(d), func() (err error) {
		c, err = net.DialTimeout("tcp4", "127.0.0.1:"+strconv.Itoa(port), dialTimeout)
		return
	})
	return c, err
}

func (d netnsDialer) close() { unix.Close(int(d)) }

// publishWith listens on a free port of 127.0.0.1 (and on its unix
// socket in PortsDir) and relays each connection to port through d.
func publishWith(d portDialer, port int) (*Published, error) {
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	p := &Published{ln: ln, d: d, port: port, owner: uint32(os.Geteuid()), conns: map[net.Conn]struct{}{}}
	if dir, err := PortsDir(); err == nil {
		if p.sock, err = listenPrivate(filepath.Join(dir, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))); err != nil {
			ln.Close()
			return nil, fmt.Errorf("the published port's socket: %w", err)
		}
	}
	p.wg.Add(1)
	go p.serve(ln, p.ownerOnly)
	if p.sock != nil {
		p.wg.Add(1)
		go p.serve(p.sock, nil)
	}
	return p, nil
}

// Addr is the host's loopback address ("127.0.0.1:PORT") it listens on,
// for this user only.
func (p *Published) Addr() string { return p.ln.Addr().String() }

// Socket is the path of its unix socket ("" where PortsDir is unusable).
func (p *Published) Socket() string {
	if p.sock == nil {
		return ""
	}
	return p.sock.Addr().String()
}

// ownerOnly says whether the connection c accepted on the loopback port
// comes from a socket of the owner's (or root's): the kernel's socket
// diagnostics give the owner uid of the socket at c's other end, which
// is on this host's loopback, so in this network namespace. A socket it
// cannot find (gone already) is refused too.
func (p *Published) ownerOnly(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	uid, err := peerUID(tc)
	return err == nil && (uid == p.owner || uid == 0)
}

// peerUID is the owner uid of the socket at the other end of c, a TCP
// connection over this host's IPv4 loopback: the kernel's socket
// diagnostics (sock_diag, NETLINK_SOCK_DIAG), asked for exactly that
// socket (its four-tuple; no dump of the table, which would cost in
// proportion to the host's sockets).
func peerUID(c *net.TCPConn) (uint32, error) {
	la, lok := c.LocalAddr().(*net.TCPAddr)
	ra, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok || la.IP.To4() == nil || ra.IP.To4() == nil {
		return 0, errors.New("not an IPv4 TCP connection")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return 0, os.NewSyscallError("setsockopt", err)
	}
	// struct nlmsghdr, then struct inet_diag_req_v2 (linux/inet_diag.h).
	req := make([]byte, 16+56)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	r := req[16:]
	r[0], r[1] = unix.AF_INET, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], ^uint32(0)) // any state
	id := r[8:]                     // struct inet_diag_sockid: the peer's socket
	binary.BigEndian.PutUint16(id[0:], uint16(ra.Port))
	binary.BigEndian.PutUint16(id[2:], uint16(la.Port))
	copy(id[4:8], ra.IP.To4())
	copy(id[20:24], la.IP.To4())
	ne.PutUint32(id[40:], ^uint32(0)) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], ^uint32(0))
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, os.NewSyscallError("sendto", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, os.NewSyscallError("recvfrom", err)
	}
	buf = buf[:n]
	if len(buf) < 16 {
		return 0, errors.New("sock_diag: short answer")
	}
	if ne.Uint16(buf[4:]) == unix.NLMSG_ERROR {
		if len(buf) >= 20 {
			if errno := -int32(ne.Uint32(buf[16:])); errno != 0 {
				return 0, fmt.Errorf("sock_diag: %w", unix.Errno(errno))
			}
		}
		return 0, errors.New("sock_diag: no such socket")
	}
	// struct inet_diag_msg: family, state, timer, retrans, the sockid
	// (48 bytes), expires, rqueue, wqueue, then uid.
	m := buf[16:]
	if len(m) < 68 || m[0] != unix.AF_INET || binary.BigEndian.Uint16(m[4:]) != uint16(ra.Port) || binary.BigEndian.Uint16(m[6:]) != uint16(la.Port) {
		return 0, errors.New("sock_diag: not the socket asked for")
	}
	return ne.Uint32(m[64:]), nil
}

func (p *Published) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Published) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Published) serve(ln net.Listener, allow func(net.Conn) bool) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // EMFILE and the like
			continue
		}
		if allow != nil && !allow(c) {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // reset: another user's connection
			}
			c.Close()
			continue
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			in, err := p.d.dialPort(p.port)
			if err != nil {
				return
			}
			if !p.track(in) {
				in.Close()
				return
			}
			defer p.untrack(in)
			relay(c.(halfCloser), in)
		}()
	}
}

// Close stops listening, ends every relayed connection and waits.
func (p *Published) Close() {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.done = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.ln.Close()
	if p.sock != nil {
		p.sock.Close() // and unlinks it
	}
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
	if p.ownsD {
		p.d.close()
	}
}
