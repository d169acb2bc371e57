// Package connlimit bounds the connections a server holds: in all, and
// from any one source address. A connection over either bound is closed as
// soon as it is accepted (a refusal, never a wait: a server that waited
// would let the backlog fill with the same load), and the listener goes on
// accepting. With the per-source bound below the total one, a flood from a
// few addresses (20,000 idle connections once exhausted `managoat serve`'s
// descriptors) cannot take the last slots from everyone else, and the
// connections already held, a runner's WebSocket among them, keep working.
//
// golang.org/x/net/netutil.LimitListener bounds the total only, and by
// making Accept wait; this package is the few lines that do both bounds by
// refusal.
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
)

// Listener wraps a net.Listener with the bounds.
type Listener struct {
	net.Listener
	// Total and PerSource are the bounds (zero: none).
	Total, PerSource int
	// Refused counts the connections closed at once.
	Refused atomic.Int64

	mu    sync.Mutex
	n     int
	bySrc map[string]int
}

// New wraps ln with the given bounds.
func New(ln net.Listener, total, perSource int) *Listener {
	return &Listener{Listener: ln, Total: total, PerSource: perSource, bySrc: map[string]int{}}
}

// Accept returns the next connection within the bounds; those over them
// are closed and counted.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source(c.RemoteAddr())
		l.mu.Lock()
		if (l.Total > 0 && l.n >= l.Total) || (l.PerSource > 0 && l.bySrc[src] >= l.PerSource) {
			l.mu.Unlock()
			l.Refused.Add(1)
			_ = c.Close()
			continue
		}
		l.n++
		l.bySrc[src]++
		l.mu.Unlock()
		return &conn{Conn: c, l: l, src: src}, nil
	}
}

// Open reports how many accepted connections are open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *Listener) release(src string) {
	l.mu.Lock()
	l.n--
	if l.bySrc[src]--; l.bySrc[src] <= 0 {
		delete(l.bySrc, src)
	}
	l.mu.Unlock()
}

// source is the address a connection comes from, without its port; an
// IPv6 address counts as its /64, which one host commonly holds whole.
func source(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ta.IP.To4() == nil && len(ta.IP) == net.IPv6len {
			return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
		}
		return ta.IP.String()
	}
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

type conn struct {
	net.Conn
	l    *Listener
	src  string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src) })
	return err
}
