package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"

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
	nft    *nft
}

func (n *namespace) close() {
	for _, c := range []interface{ Close() error }{n.tcp, n.dnsUDP, n.dnsTCP} {
		if c != nil && !isNilCloser(c) {
			c.Close()
		}
	}
	if n.nft != nil {
		n.nft.close()
		n.nft = nil
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
//	    reset; with no policy other TCP: accept; with one, TCP to an
//	    address of the sets (hosts: what the sandbox resolved an allowed
//	    name to; cidrs: the policy's IPv4 CIDRs): accept, other TCP:
//	    reset; anything else: reject (UDP) or drop
//	output NAT: TCP not to lo: redirect to the proxy's port
//	IPv6: anything not to lo: reset or drop
func (n *namespace) filter(denied []netip.Prefix) error {
	c, err := nftables.New(nftables.WithNetNSFd(n.nsfd), nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	f := &nft{c: c, denied: denied, loIdx: binaryutil.NativeEndian.PutUint32(1)}
	if lo, err := net.InterfaceByName("lo"); err == nil {
		f.loIdx = binaryutil.NativeEndian.PutUint32(uint32(lo.Index))
	}
	f.t4 = c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName})
	f.out = c.AddChain(&nftables.Chain{Name: "out", Table: f.t4, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRef(-150)})
	// The sets' IDs (which name them within one batch) are set here:
	// left zero, the library takes one from a global counter it does not
	// guard, a data race between sandboxes starting at once.
	f.hosts = &nftables.Set{Table: f.t4, ID: 1, Name: "hosts", KeyType: nftables.TypeIPAddr}
	f.cidrs = &nftables.Set{Table: f.t4, ID: 2, Name: "cidrs", KeyType: nftables.TypeIPAddr, Interval: true}
	for _, set := range []*nftables.Set{f.hosts, f.cidrs} {
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("nftables set: %w", err)
		}
	}
	nat := c.AddChain(&nftables.Chain{Name: "nat", Table: f.t4, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	f.rule(nat, f.toLo(), accept)
	f.rule(nat, isTCP, []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(n.port)},
		&expr.Redir{RegisterProtoMin: 1},
	})
	t6 := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: tableName})
	f6 := c.AddChain(&nftables.Chain{Name: "out", Table: t6, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	f.rule(f6, f.toLo(), accept)
	f.rule(f6, isTCP, rstTCP)
	f.rule(f6, drop)
	f.outRules(false)
	if err := c.Flush(); err != nil {
		c.CloseLasting()
		return fmt.Errorf("install the packet filter: %w", err)
	}
	n.nft = f
	return nil
}

// nft is a sandbox's packet filter, kept to change it with its policy.
type nft struct {
	mu     sync.Mutex
	c      *nftables.Conn
	t4     *nftables.Table
	out    *nftables.Chain
	hosts  *nftables.Set
	cidrs  *nftables.Set
	denied []netip.Prefix
	loIdx  []byte
}

var (
	isTCP = []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	isUDP = []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
	}
	daddr4  = []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
	accept  = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop    = []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
	rstTCP  = []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	unreach = []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}} // port unreachable
)

func (f *nft) toLo() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIF, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: f.loIdx},
	}
}

func (f *nft) rule(ch *nftables.Chain, parts ...[]expr.Any) {
	var e []expr.Any
	for _, p := range parts {
		e = append(e, p...)
	}
	f.c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: e})
}

// outRules queues the output chain's rules (see filter).
func (f *nft) outRules(policed bool) {
	f.rule(f.out, f.toLo(), accept)
	for _, p := range f.denied {
		m := net.CIDRMask(p.Bits(), 32)
		net4 := p.Masked().Addr().As4()
		f.rule(f.out, isTCP, daddr4, []expr.Any{
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net4[:]},
		}, rstTCP)
	}
	if policed {
		f.rule(f.out, isTCP, daddr4, []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: f.hosts.Name, SetID: f.hosts.ID}}, accept)
		f.rule(f.out, isTCP, daddr4, []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: f.cidrs.Name, SetID: f.cidrs.ID}}, accept)
		f.rule(f.out, isTCP, rstTCP)
	} else {
		f.rule(f.out, isTCP, accept)
	}
	f.rule(f.out, isUDP, unreach)
	f.rule(f.out, drop)
}

// setPolicy replaces the filter's rules and sets for pol (nil: no
// policy), with hosts the addresses the sandbox resolved allowed names to.
func (f *nft) setPolicy(pol *Policy, hosts []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.c.FlushChain(f.out)
	f.c.FlushSet(f.hosts)
	f.c.FlushSet(f.cidrs)
	if pol != nil {
		if err := f.addHostsLocked(hosts); err != nil {
			return err
		}
		var elems []nftables.SetElement
		for _, r := range mergeV4(pol.cidrs) {
			elems = append(elems, nftables.SetElement{Key: r[0][:]}, nftables.SetElement{Key: r[1][:], IntervalEnd: true})
		}
		if len(elems) > 0 {
			if err := f.c.SetAddElements(f.cidrs, elems); err != nil {
				return err
			}
		}
	}
	f.outRules(pol != nil)
	return f.c.Flush()
}

// addHosts lets TCP to addrs reach the proxy.
func (f *nft) addHosts(addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.addHostsLocked(addrs); err != nil {
		return err
	}
	return f.c.Flush()
}

func (f *nft) addHostsLocked(addrs []netip.Addr) error {
	var elems []nftables.SetElement
	for _, a := range addrs {
		if a.Is4() {
			b := a.As4()
			elems = append(elems, nftables.SetElement{Key: b[:]})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	return f.c.SetAddElements(f.hosts, elems)
}

func (f *nft) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.c.CloseLasting()
}

// mergeV4 turns the IPv4 CIDR rules into sorted, disjoint [start, end)
// ranges (an interval set refuses overlaps). A range reaching
// 255.255.255.255 stops one short of it (the broadcast address, denied
// anyway): the end of an interval is the first address after it.
func mergeV4(rules []cidrRule) [][2][4]byte {
	type rng struct{ lo, hi uint64 } // [lo, hi)
	var rs []rng
	for _, r := range rules {
		if !r.prefix.Addr().Is4() {
			continue
		}
		b := r.prefix.Masked().Addr().As4()
		lo := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
		hi := lo + 1<<(32-r.prefix.Bits())
		if hi > 0xffffffff {
			hi = 0xffffffff
		}
		rs = append(rs, rng{lo, hi})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi {
			if r.hi > merged[n-1].hi {
				merged[n-1].hi = r.hi
			}
			continue
		}
		merged = append(merged, r)
	}
	out := make([][2][4]byte, 0, len(merged))
	for _, r := range merged {
		out = append(out, [2][4]byte{be4(r.lo), be4(r.hi)})
	}
	return out
}

func be4(v uint64) [4]byte { return [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

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
