package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Config is how sandboxes' traffic leaves the host. The zero Config
// dials from this process's network namespace and resolves through the
// host's resolvers.
type Config struct {
	// Dial opens a connection to the outside world ("tcp4" or "udp4" and
	// an "ip:port"). Default: a net.Dialer in this process's network
	// namespace with a 10 s timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Resolvers are the upstream DNS servers ("ip:port"). Default: the
	// nameservers of the host's /etc/resolv.conf.
	Resolvers []string
	// AllowPrivate opens the private ranges (10/8, 100.64/10,
	// 172.16/12, 192.168/16, 198.18/15, fc00::/7), which are denied by
	// default. Loopback, link-local and this host's own addresses stay
	// denied.
	AllowPrivate bool
	// MaxConns bounds a sandbox's connections open at once (default
	// 1024); past it a new connection is reset.
	MaxConns int
	// ConnRate bounds how many new connections a sandbox may open per
	// second (default 256, with bursts of twice as many); past it a new
	// connection is reset, so a sandbox opening connections as fast as it
	// can spends neither the host's ports nor this process's time.
	ConnRate float64
	// PeekTimeout bounds how long a connection that only a domain entry
	// can allow may take to send its TLS ClientHello or HTTP request
	// head (default 10 s).
	PeekTimeout time.Duration
	// OnRefusal, when set, is told of what the policy refused (see
	// Refusal), at most 10 a second (bursts of 50; the others are
	// counted and said with the next), and not again for one like the
	// last told within 10 s; it must not block. Proxy.Refusals keeps the
	// latest either way.
	OnRefusal func(Refusal)
}

func (c Config) withDefaults() Config {
	if c.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		c.Dial = d.DialContext
	}
	if c.Resolvers == nil {
		c.Resolvers = hostResolvers()
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.ConnRate <= 0 {
		c.ConnRate = 256
	}
	if c.PeekTimeout <= 0 {
		c.PeekTimeout = 10 * time.Second
	}
	return c
}

// hostResolvers reads the nameservers of /etc/resolv.conf.
func hostResolvers() []string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return []string{}
	}
	out := []string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

// Proxy is one sandbox's egress: its resolver and the proxy every TCP
// connection it opens is redirected to, with the policy in force.
type Proxy struct {
	cfg Config
	ns  *namespace
	sem chan struct{}
	lim *rate.Limiter

	mu       sync.Mutex
	policy   *Policy
	flows    map[*flow]struct{}
	resolved map[netip.Addr]map[string]time.Time // address -> names the sandbox resolved to it -> until
	nres     int
	closed   bool
	refused  refusals

	done chan struct{}
	wg   sync.WaitGroup
}

// flow is one proxied connection.
type flow struct {
	in   *net.TCPConn
	out  net.Conn
	dst  netip.AddrPort
	name string // the TLS SNI or HTTP Host it was allowed by ("" when by address)
}

func (f *flow) close() {
	f.in.SetLinger(0)
	f.in.Close()
	if f.out != nil {
		f.out.Close()
	}
}

// Attach gives the sandbox whose network namespace is pid's its egress:
// it sets up the namespace (it must be fresh, with only lo) and starts
// serving. policy nil allows every public destination. As root it enters
// the namespace itself; as another user, pid must be in a user namespace
// this user owns (a rootless sandbox), which a helper executed there sets
// up (see the package doc's Rootless).
func Attach(pid int, policy *Policy, cfg Config) (*Proxy, error) {
	if os.Geteuid() != 0 {
		cfg = cfg.withDefaults()
		ns, err := attachRootless(pid, cfg.AllowPrivate)
		if err != nil {
			return nil, err
		}
		return serve(ns, policy, cfg)
	}
	fd, err := openPidNetns(pid)
	if err != nil {
		return nil, err
	}
	defer closeFD(fd)
	return AttachNetns(fd, policy, cfg)
}

// AttachNetns is Attach for a network namespace given by descriptor.
func AttachNetns(nsfd int, policy *Policy, cfg Config) (*Proxy, error) {
	cfg = cfg.withDefaults()
	ns, err := openNamespace(nsfd, cfg.AllowPrivate)
	if err != nil {
		return nil, err
	}
	return serve(ns, policy, cfg)
}

// serve starts the proxy of a namespace set up for it.
func serve(ns *namespace, policy *Policy, cfg Config) (*Proxy, error) {
	p := &Proxy{cfg: cfg, ns: ns, sem: make(chan struct{}, cfg.MaxConns), lim: rate.NewLimiter(rate.Limit(cfg.ConnRate), int(2*cfg.ConnRate)+1), policy: policy,
		flows: map[*flow]struct{}{}, resolved: map[netip.Addr]map[string]time.Time{}, refused: newRefusals(), done: make(chan struct{})}
	if policy != nil {
		if err := ns.nft.setPolicy(policy, nil); err != nil {
			ns.close()
			return nil, fmt.Errorf("packet filter: %w", err)
		}
	}
	p.wg.Add(3)
	go p.acceptTCP()
	go p.serveDNSUDP()
	go p.serveDNSTCP()
	return p, nil
}

// Close ends every connection and the resolver, and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	flows := p.flows
	p.flows = map[*flow]struct{}{}
	p.mu.Unlock()
	p.ns.close()
	for f := range flows {
		f.close()
	}
	p.wg.Wait()
	return nil
}

// CloseWhen closes p when done is closed (the sandbox's init ended).
func (p *Proxy) CloseWhen(done <-chan struct{}) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		select {
		case <-done:
			go p.Close() // Close waits for this goroutine
		case <-p.done:
		}
	}()
}

// Policy returns the policy in force (nil: every public destination).
func (p *Proxy) Policy() *Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.policy
}

// SetPolicy puts pol in force: new connections are checked against it
// at once (the sandbox's packet filter resets, at connect, TCP to an
// address no entry and no allowed name it resolved can allow), and every
// open connection it does not allow is cut before SetPolicy returns. It
// returns how many were cut; an error means the packet filter could not
// be changed (the proxy enforces pol all the same).
func (p *Proxy) SetPolicy(pol *Policy) (int, error) {
	p.mu.Lock()
	p.policy = pol
	var cut []*flow
	for f := range p.flows {
		if !p.allowedLocked(f) {
			cut = append(cut, f)
			delete(p.flows, f)
		}
	}
	var hosts []netip.Addr
	if pol != nil {
		for a, names := range p.resolved {
			for n := range names {
				if pol.AllowsName(n, 0) {
					hosts = append(hosts, a)
					break
				}
			}
		}
	}
	var err error
	if !p.closed {
		err = p.ns.nft.setPolicy(pol, hosts)
	}
	p.mu.Unlock()
	for _, f := range cut {
		f.close()
	}
	return len(cut), err
}

// allowedLocked: the flow's destination is allowed by an address entry,
// or the name it presented is allowed and the sandbox resolved that name
// to that address through its resolver. With no policy, everything
// public is allowed (forbidden destinations never get a flow).
func (p *Proxy) allowedLocked(f *flow) bool {
	pol := p.policy
	if pol == nil || pol.AllowsAddr(f.dst.Addr(), f.dst.Port()) {
		return true
	}
	if f.name == "" || !pol.AllowsName(f.name, f.dst.Port()) {
		return false
	}
	_, ok := p.resolved[f.dst.Addr()][f.name]
	return ok
}

func (p *Proxy) acceptTCP() {
	defer p.wg.Done()
	for {
		c, err := p.ns.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // EMFILE and the like
			continue
		}
		if !p.lim.Allow() {
			reset(c) // too many too fast
			continue
		}
		select {
		case p.sem <- struct{}{}:
		default:
			reset(c) // too many at once
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.sem }()
			p.handle(c)
		}()
	}
}

func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// handle decides on one redirected connection and relays it.
func (p *Proxy) handle(c *net.TCPConn) {
	dst, err := originalDst(c)
	if err != nil || dst.Addr().IsLoopback() || dst.Addr().IsUnspecified() {
		reset(c) // not redirected: someone dialled the proxy's port itself
		return
	}
	if forbidden(dst.Addr(), p.cfg.AllowPrivate) != "" {
		reset(c)
		return
	}
	f := &flow{in: c, dst: dst}
	p.mu.Lock()
	pol := p.policy
	needName := pol != nil && !pol.AllowsAddr(dst.Addr(), dst.Port())
	known := len(p.resolved[dst.Addr()]) > 0
	p.mu.Unlock()
	var pk peeked
	if needName {
		if !known {
			p.refuse(Refusal{What: "connection", Dst: dst, Why: "no entry allows the address, and the sandbox resolved no allowed name to it"})
			reset(c) // an address the sandbox never resolved an allowed name to
			return
		}
		if pk, err = sniff(c, p.cfg.PeekTimeout); err != nil || pk.name == "" {
			p.refuse(Refusal{What: "connection", Dst: dst, Why: "only a domain entry could allow it, and it named no host (TLS SNI or HTTP Host)"})
			reset(c)
			return
		}
		f.name = pk.name
	}
	p.mu.Lock()
	if p.closed || !p.allowedLocked(f) {
		closed := p.closed
		p.mu.Unlock()
		if !closed {
			p.refuse(Refusal{What: "connection", Name: f.name, Dst: dst, Why: "no entry allows the name on this port, or the sandbox did not resolve it to this address"})
		}
		if pk.req != nil && !closed {
			refuseHTTP(c, fmt.Sprintf("it does not allow %s on port %d (at %s)", clip(f.name), dst.Port(), dst.Addr()))
			c.CloseWrite()
			c.Close()
			return
		}
		reset(c)
		return
	}
	p.flows[f] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.flows, f)
		p.mu.Unlock()
		f.close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	go func() {
		select {
		case <-p.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	out, err := p.cfg.Dial(ctx, "tcp4", dst.String())
	cancel()
	if err != nil {
		return // reset by the deferred close
	}
	p.mu.Lock()
	if _, live := p.flows[f]; !live {
		p.mu.Unlock()
		out.Close()
		return // cut meanwhile
	}
	f.out = out
	p.mu.Unlock()
	if pk.req != nil { // plain HTTP: every request is checked
		if r := p.relayHTTP(c, out, pk, f.name); r.why != "" {
			p.refuse(Refusal{What: "request", Name: f.name, Dst: dst, Why: r.why})
		}
		return
	}
	if len(pk.pre) > 0 {
		if _, err := out.Write(pk.pre); err != nil {
			return
		}
	}
	relay(c, out)
}

// halfCloser is a connection that can end its writing half (TCP, unix).
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// relay copies both ways until both are done, passing on half-closes.
func relay(in halfCloser, out net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(out, in)
		if cw, ok := out.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			out.Close()
		}
	}()
	_, _ = io.Copy(in, out)
	_ = in.CloseWrite()
	<-done
}

// readOnly is a net.Conn that reads from r and swallows writes (the TLS
// alert the aborted handshake sends never reaches the sandbox).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c readOnly) Write(b []byte) (int, error)        { return len(b), nil }
func (c readOnly) Close() error                       { return nil }
func (c readOnly) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c readOnly) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c readOnly) SetDeadline(t time.Time) error      { return nil }
func (c readOnly) SetReadDeadline(t time.Time) error  { return nil }
func (c readOnly) SetWriteDeadline(t time.Time) error { return nil }

// Stats are a proxy's counters now.
type Stats struct {
	Open     int // connections relayed now
	Resolved int // addresses the sandbox resolved that are remembered
}

// Stats returns p's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Open: len(p.flows), Resolved: len(p.resolved)}
}

// Port is the port on the sandbox's loopback that its TCP connections
// are redirected to.
func (p *Proxy) Port() uint16 { return p.ns.port }

func (p *Proxy) String() string { return fmt.Sprintf("egress proxy on port %d", p.ns.port) }
