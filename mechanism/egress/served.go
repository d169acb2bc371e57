package egress

import "sync"

// Served is what one process serves for its sandboxes, by sandbox id:
// each one's proxy and published ports (the jail's and the oci
// mechanism's alike). A sandbox's proxy and ports live in the process
// that started it (or adopted it) and end with that process. The zero
// value is ready; it is safe for concurrent use.
type Served struct {
	mu      sync.Mutex
	proxies map[string]*Proxy
	ports   map[string]*Ports
}

// SetProxy makes p id's proxy, closing the one it replaces.
func (s *Served) SetProxy(id string, p *Proxy) {
	s.mu.Lock()
	if s.proxies == nil {
		s.proxies = map[string]*Proxy{}
	}
	old := s.proxies[id]
	s.proxies[id] = p
	s.mu.Unlock()
	if old != nil && old != p {
		old.Close()
	}
}

// SetPorts makes ps id's published ports, closing the ones they replace.
func (s *Served) SetPorts(id string, ps *Ports) {
	s.mu.Lock()
	if s.ports == nil {
		s.ports = map[string]*Ports{}
	}
	old := s.ports[id]
	s.ports[id] = ps
	s.mu.Unlock()
	if old != ps {
		old.Close()
	}
}

// Proxy is id's proxy, nil when this process serves none.
func (s *Served) Proxy(id string) *Proxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxies[id]
}

// HasPorts reports whether this process publishes id's ports.
func (s *Served) HasPorts(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ports[id]
	return ok
}

// Stop closes id's proxy, then its published ports, and forgets both.
func (s *Served) Stop(id string) {
	s.mu.Lock()
	p, ps := s.proxies[id], s.ports[id]
	delete(s.proxies, id)
	delete(s.ports, id)
	s.mu.Unlock()
	if p != nil {
		p.Close()
	}
	ps.Close()
}
