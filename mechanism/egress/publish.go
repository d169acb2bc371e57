package egress

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Published relays the connections made to an address on the host's
// loopback (127.0.0.1, never an address another machine can reach) to a
// port on a sandbox's own loopback: how an application served inside a
// sandbox is reached from this machine.
type Published struct {
	ln    *net.TCPListener
	nsfd  int
	port  int
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// Publish publishes port of the sandbox whose init is pid on a free port
// of 127.0.0.1. The caller must be root (it enters the sandbox's network
// namespace for each connection).
func Publish(pid, port int) (*Published, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is not 1 to 65535", port)
	}
	fd, err := openPidNetns(pid)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	p := &Published{ln: ln, nsfd: fd, port: port, conns: map[net.Conn]struct{}{}}
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
			var in net.Conn
			err := onThreadIn(p.nsfd, func() (err error) {
				in, err = net.Dial("tcp4", "127.0.0.1:"+strconv.Itoa(p.port))
				return
			})
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
	unix.Close(p.nsfd)
}
