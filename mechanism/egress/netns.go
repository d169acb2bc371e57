package egress

import (
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
	"golang.org/x/sys/unix"
)

const (
	// ResolverAddr is the sandbox's resolver, on the sandbox's own
	// loopback (its /etc/resolv.conf names it).
	ResolverAddr = "127.0.0.53"
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
// namespace nsfd; the thread is discarded afterwards. Go cannot end the
// process's main thread: a goroutine that exits locked to it wedges it,
// in whatever namespace it was left, and /proc/PID/ns/net (which is the
// main thread's) would name the sandbox's from then on. So on the main
// thread the namespace is entered with a way back, and left before the
// goroutine ends.
func onThreadIn(nsfd int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked (but on the main thread, once back): the thread
		// ends with the goroutine, namespace and all.
		leave, err := enterNetns(nsfd)
		if err != nil {
			errc <- fmt.Errorf("enter the sandbox's network namespace: %w", err)
			return
		}
		err = f()
		leave()
		errc <- err
	}()
	return <-errc
}

// enterNetns moves the calling locked thread into the network namespace
// nsfd. leave puts the main thread back where it was and unlocks it
// (another thread is left as is, to end with its goroutine).
func enterNetns(nsfd int) (leave func(), err error) {
	if unix.Gettid() != unix.Getpid() {
		return func() {}, unix.Setns(nsfd, unix.CLONE_NEWNET)
	}
	back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		unix.Close(back)
		runtime.UnlockOSThread()
		return nil, err
	}
	return func() {
		if unix.Setns(back, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else it stays locked: wedged, but nothing else runs there
		unix.Close(back)
	}, nil
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
	h, err := netlink.NewHandle() // this thread's namespace: the sandbox's
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	// A default route through lo: connect(2) to any IPv4 address gets
	// as far as the NAT rules (it would fail with ENETUNREACH before
	// them); a packet they do not redirect loops back and is dropped, as
	// the namespace has no other interface and forwards nothing.
	// Its source is 127.0.0.1 (lo's only address, of host scope, is not
	// chosen for a link-scope route by itself).
	if err := h.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, Src: net.IPv4(127, 0, 0, 1)}); err != nil {
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

// closedPort is where a connection that may not leave is redirected: a
// port on the sandbox's loopback nothing listens on (below 1024, which
// the workload, without CAP_NET_BIND_SERVICE, cannot bind), so TCP is
// refused at connect and UDP gets port unreachable.
const closedPort = 1

// filter installs the sandbox's packet filter: one nftables NAT chain on
// the output hook, in the sandbox's namespace, out of the workload's
// reach (it has no CAP_NET_ADMIN, and seccomp refuses new namespaces):
//
//	to 127.0.0.0/8 (the sandbox's own loopback): as is
//	UDP: to closedPort (only the resolver, on the loopback, answers)
//	TCP to a denied prefix (set "deny"): to closedPort
//	with a policy: TCP to an address of set "hosts" (what the sandbox
//	    resolved an allowed name to) or "cidrs" (the policy's IPv4
//	    CIDRs): to the proxy; other TCP: to closedPort
//	with none: TCP to the proxy
//
// The namespace has no interface but lo and no IPv6 route but ::1, so
// nothing else has anywhere to go.
func (n *namespace) filter(denied []netip.Prefix) error {
	// The netlink socket is made on this thread, in the sandbox's
	// namespace, and stays there for later changes.
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	f := &nft{c: c, port: n.port}
	// A namespace set up before (by a process that died) gets its rules
	// anew: the old ones redirect to a port nobody holds now.
	if ts, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4); err == nil {
		for _, t := range ts {
			if t.Name == tableName {
				c.DelTable(t)
			}
		}
	}
	f.t4 = c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName})
	f.out = c.AddChain(&nftables.Chain{Name: "out", Table: f.t4, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	// The sets' IDs (which name them within one batch) are set here:
	// left zero, the library takes one from a global counter it does not
	// guard, a data race between sandboxes starting at once.
	f.deny = &nftables.Set{Table: f.t4, ID: 1, Name: "deny", KeyType: nftables.TypeIPAddr, Interval: true}
	f.hosts = &nftables.Set{Table: f.t4, ID: 2, Name: "hosts", KeyType: nftables.TypeIPAddr}
	f.cidrs = &nftables.Set{Table: f.t4, ID: 3, Name: "cidrs", KeyType: nftables.TypeIPAddr, Interval: true}
	var rules []cidrRule
	for _, p := range denied {
		rules = append(rules, cidrRule{prefix: p})
	}
	for _, set := range []*nftables.Set{f.deny, f.hosts, f.cidrs} {
		var elems []nftables.SetElement
		if set == f.deny {
			elems = intervals(rules)
		}
		if err := c.AddSet(set, elems); err != nil {
			return fmt.Errorf("nftables set: %w", err)
		}
	}
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
	mu    sync.Mutex
	c     *nftables.Conn
	t4    *nftables.Table
	out   *nftables.Chain
	deny  *nftables.Set
	hosts *nftables.Set
	cidrs *nftables.Set
	port  uint16 // the proxy's
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
	toLoopback = []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127}},
	}
	daddr4 = []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
	accept = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
)

func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func inSet(s *nftables.Set) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

func (f *nft) rule(parts ...[]expr.Any) {
	var e []expr.Any
	for _, p := range parts {
		e = append(e, p...)
	}
	f.c.AddRule(&nftables.Rule{Table: f.t4, Chain: f.out, Exprs: e})
}

// outRules queues the chain's rules (see filter).
func (f *nft) outRules(policed bool) {
	f.rule(toLoopback, accept)
	f.rule(isUDP, redirectTo(closedPort))
	f.rule(isTCP, daddr4, inSet(f.deny), redirectTo(closedPort))
	if policed {
		f.rule(isTCP, daddr4, inSet(f.hosts), redirectTo(f.port))
		f.rule(isTCP, daddr4, inSet(f.cidrs), redirectTo(f.port))
		f.rule(isTCP, redirectTo(closedPort))
	} else {
		f.rule(isTCP, redirectTo(f.port))
	}
}

// setPolicy replaces the filter's rules and sets for pol (nil: no
// policy), with hosts the addresses the sandbox resolved allowed names to.
func (f *nft) setPolicy(pol *Policy, hosts []netip.Addr) error {
	if f == nil {
		return nil // rootless: the proxy enforces pol alone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.c.FlushChain(f.out)
	f.c.FlushSet(f.hosts)
	f.c.FlushSet(f.cidrs)
	if pol != nil {
		if err := f.addHostsLocked(hosts); err != nil {
			return err
		}
		if elems := intervals(pol.cidrs); len(elems) > 0 {
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
	if f == nil {
		return nil
	}
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

// intervals are the elements of an interval set holding rules' IPv4
// prefixes.
func intervals(rules []cidrRule) []nftables.SetElement {
	var elems []nftables.SetElement
	for _, r := range mergeV4(rules) {
		elems = append(elems, nftables.SetElement{Key: r[0][:]}, nftables.SetElement{Key: r[1][:], IntervalEnd: true})
	}
	return elems
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
