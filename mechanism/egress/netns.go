package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The sandbox's side of the network, the same in every sandbox: it never
// leaves the sandbox's namespace (the peer of eth0 is in the namespace
// too and forwards nothing), so two sandboxes sharing it see nothing of
// each other.
const (
	// SandboxAddr is the sandbox's own address on eth0.
	SandboxAddr = "10.0.2.15"
	// ResolverAddr is the sandbox's resolver, on the sandbox's own
	// loopback (its /etc/resolv.conf names it).
	ResolverAddr = "127.0.0.53"
	ifName       = "eth0"
	peerName     = "eth0-peer"
	tableName    = "managoat"
)

// namespace is what the proxy holds in a sandbox's network namespace:
// the listening sockets (made there, so they live there) and a handle on
// the namespace for its packet filter.
type namespace struct {
	nsfd   int
	tcp    *net.TCPListener // 127.0.0.1:port, where every outgoing TCP connection is redirected
	dnsUDP *net.UDPConn     // ResolverAddr:53
	dnsTCP *net.TCPListener // ResolverAddr:53
	port   uint16
}

func (n *namespace) close() {
	for _, c := range []interface{ Close() error }{n.tcp, n.dnsUDP, n.dnsTCP} {
		if c != nil && !isNilCloser(c) {
			c.Close()
		}
	}
	if n.nsfd >= 0 {
		unix.Close(n.nsfd)
		n.nsfd = -1
	}
}

func isNilCloser(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *net.TCPListener:
		return v == nil
	case *net.UDPConn:
		return v == nil
	}
	return false
}

// onThreadIn runs f on a locked OS thread that has joined the network
// namespace nsfd; the thread is discarded afterwards.
func onThreadIn(nsfd int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with the goroutine, namespace and all.
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the sandbox's network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// openNamespace sets up the network namespace nsfd (a fresh one, lo
// up) for egress: eth0 and a default route through it, the packet
// filter, and the proxy's sockets. It dups nsfd.
func openNamespace(nsfd int, allowPrivate bool) (*namespace, error) {
	dup, err := unix.FcntlInt(uintptr(nsfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	n := &namespace{nsfd: dup}
	// This host's addresses are read here, in this process's namespace.
	denied := deniedPrefixes(allowPrivate)
	err = onThreadIn(nsfd, func() error { return n.setup(denied) })
	if err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// setup runs on a thread in the namespace.
func (n *namespace) setup(denied []netip.Prefix) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(n.nsfd))
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ifName}, PeerName: peerName}
	if err := h.LinkAdd(veth); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s: %w", ifName, err)
	}
	eth, err := h.LinkByName(ifName)
	if err != nil {
		return err
	}
	peer, err := h.LinkByName(peerName)
	if err != nil {
		return err
	}
	addr, _ := netlink.ParseAddr(SandboxAddr + "/24")
	if err := h.AddrReplace(eth, addr); err != nil {
		return fmt.Errorf("address %s: %w", ifName, err)
	}
	for _, l := range []netlink.Link{peer, eth} {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("up %s: %w", l.Attrs().Name, err)
		}
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// The sockets first, so nothing is redirected to a port nobody holds.
	if n.tcp, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	n.port = uint16(n.tcp.Addr().(*net.TCPAddr).Port)
	ra := net.ParseIP(ResolverAddr)
	if n.dnsUDP, err = net.ListenUDP("udp4", &net.UDPAddr{IP: ra, Port: 53}); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	if n.dnsTCP, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: ra, Port: 53}); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	return n.filter(denied)
}

// filter installs the sandbox's packet filter (nftables, in the
// sandbox's namespace, out of the workload's reach: it has no
// CAP_NET_ADMIN and seccomp refuses new namespaces):
//
//	output, before NAT: to lo: accept; IPv4 TCP to a denied prefix:
//	    reset; other TCP: accept; anything else: reject (UDP) or drop
//	output NAT: TCP not to lo: redirect to the proxy's port
//	IPv6: anything not to lo: reject
func (n *namespace) filter(denied []netip.Prefix) error {
	c, err := nftables.New(nftables.WithNetNSFd(n.nsfd))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	loIdx := binaryutil.NativeEndian.PutUint32(1)
	if lo, err := net.InterfaceByName("lo"); err == nil {
		loIdx = binaryutil.NativeEndian.PutUint32(uint32(lo.Index))
	}
	toLo := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIF, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: loIdx},
	}
	isTCP := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	isUDP := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
	}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop := []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
	reset := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	unreach := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}} // port unreachable

	t4 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName})
	fil := c.AddChain(&nftables.Chain{Name: "out", Table: t4, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRef(-150)})
	rule := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: e})
	}
	rule(fil, cat(toLo, accept))
	for _, p := range denied {
		m := net.CIDRMask(p.Bits(), 32)
		net4 := p.Masked().Addr().As4()
		rule(fil, cat(isTCP, []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net4[:]},
		}, reset))
	}
	rule(fil, cat(isTCP, accept))
	rule(fil, cat(isUDP, unreach))
	rule(fil, drop)
	nat := c.AddChain(&nftables.Chain{Name: "nat", Table: t4, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	rule(nat, cat(toLo, accept))
	rule(nat, cat(isTCP, []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(n.port)},
		&expr.Redir{RegisterProtoMin: 1},
	}))
	t6 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: tableName})
	f6 := c.AddChain(&nftables.Chain{Name: "out", Table: t6, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	rule(f6, cat(toLo, accept))
	rule(f6, cat(isTCP, reset))
	rule(f6, drop)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install the packet filter: %w", err)
	}
	return nil
}

// originalDst is where a redirected connection was going.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// struct sockaddr_in fits the 16 bytes of an ipv6_mreq.
		m, e := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if e != nil {
			serr = e
			return
		}
		b := m.Multiaddr
		port := uint16(b[2])<<8 | uint16(b[3])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = serr
	}
	return ap, err
}

// nsPath is the network namespace of pid.
func nsPath(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/ns/net" }

// openPidNetns opens pid's network namespace.
func openPidNetns(pid int) (int, error) {
	fd, err := unix.Open(nsPath(pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: nsPath(pid), Err: err}
	}
	return fd, nil
}
