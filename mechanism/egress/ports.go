package egress

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Ports are the published ports of one start of a sandbox (the jail's and
// a runc container's alike): each a Published, and a record file that
// says where each is, so that another process (a CLI, the platform) can
// find them while the sandbox runs.
type Ports struct {
	pubs []*Published
	d    portDialer // shared by pubs
	once sync.Once
}

// portsRecord is what a Ports' record file holds: where each published
// port of the sandbox whose init is Pid is on the host's loopback.
type portsRecord struct {
	Pid   int            `json:"pid"`
	Ports map[int]string `json:"ports"`
}

// PublishPorts publishes each of ports of the sandbox whose init is pid
// on a free port of 127.0.0.1 (Publish) and writes where to file. On an
// error nothing stays published. As root it enters the sandbox's network
// namespace for each connection; otherwise one socket helper in the
// sandbox's namespaces serves all of ports and ends with Close or with
// the sandbox's init.
func PublishPorts(pid int, ports []int, file string) (*Ports, error) {
	for _, port := range ports {
		if err := checkPort(port); err != nil {
			return nil, fmt.Errorf("publish port %d: %w", port, err)
		}
	}
	d, err := newPortDialer(pid)
	if err != nil {
		return nil, fmt.Errorf("publish ports of %d: %w", pid, err)
	}
	ps := &Ports{d: d}
	rec := portsRecord{Pid: pid, Ports: map[int]string{}}
	for _, port := range ports {
		p, err := publishWith(d, port)
		if err != nil {
			ps.Close()
			return nil, fmt.Errorf("publish port %d: %w", port, err)
		}
		ps.pubs = append(ps.pubs, p)
		rec.Ports[port] = p.Addr()
	}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(file, b, 0o644); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}

// Close ends every published port (nil: nothing).
func (ps *Ports) Close() {
	if ps == nil {
		return
	}
	ps.once.Do(func() {
		for _, p := range ps.pubs {
			p.Close()
		}
		ps.d.close()
	})
}

// PublishedAddr is the host's loopback address of port in the record file
// that PublishPorts wrote for the init pid: "" when there is no record,
// it is another start's (another init), or port is not published. The
// caller checks that pid still runs.
func PublishedAddr(file string, pid, port int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	var rec portsRecord
	if json.Unmarshal(b, &rec) != nil || rec.Pid != pid {
		return ""
	}
	return rec.Ports[port]
}

// Listening reports whether something accepts connections at addr (a
// published port whose process is gone does not).
func Listening(addr string) bool {
	c, err := net.DialTimeout("tcp4", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
