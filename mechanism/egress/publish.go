package egress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Published relays the connections made to an address on the host's
// loopback (127.0.0.1, never an address another machine can reach) to a
// port on a sandbox's own loopback: how an application served inside a
// sandbox is reached from this machine.
type Published struct {
	ln    *net.TCPListener
	d     portDialer
	ownsD bool // Close closes d (Publish's; PublishPorts' Ports close theirs)
	port  int
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// Publish publishes port of the sandbox whose init is pid on a free port
// of 127.0.0.1. As root it enters the sandbox's network namespace for
// each connection; as another user pid must be in a user namespace this
// user owns (a rootless sandbox), where a helper makes the sockets (see
// the package doc's Rootless).
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

// publishWith listens on a free port of 127.0.0.1 and relays each
// connection to port through d.
func publishWith(d portDialer, port int) (*Published, error) {
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	p := &Published{ln: ln, d: d, port: port, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the host's loopback address ("127.0.0.1:PORT") it listens on.
func (p *Published) Addr() string { return p.ln.Addr().String() }

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

func (p *Published) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
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
			relay(c, in)
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
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
	if p.ownsD {
		p.d.close()
	}
}
