package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// maxResolved bounds the addresses a sandbox's resolver remembers.
const maxResolved = 1 << 16

// resolvedGrace is how long past its TTL an answer still allows a
// connection (programs cache answers longer than the TTL says).
const resolvedGrace = 10 * time.Minute

func (p *Proxy) serveDNSUDP() {
	defer p.wg.Done()
	sem := make(chan struct{}, 64)
	buf := make([]byte, 65535)
	for {
		n, from, err := p.ns.dnsUDP.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // flooded: drop, as a busy resolver does
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-sem }()
			r := p.answer(q)
			r.Truncate(dns.MinMsgSize)
			if q.IsEdns0() != nil {
				r.Truncate(int(q.IsEdns0().UDPSize()))
			}
			if b, err := r.Pack(); err == nil {
				_, _ = p.ns.dnsUDP.WriteToUDPAddrPort(b, from)
			}
		}()
	}
}

func (p *Proxy) serveDNSTCP() {
	defer p.wg.Done()
	for {
		c, err := p.ns.dnsTCP.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				select {
				case <-p.done:
					c.Close()
				case <-stop:
				}
			}()
			dc := &dns.Conn{Conn: c}
			for {
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				q, err := dc.ReadMsg()
				if err != nil {
					return
				}
				if dc.WriteMsg(p.answer(q)) != nil {
					return
				}
			}
		}()
	}
}

// answer answers one query of the sandbox: a name the policy does not
// allow is REFUSED (as Sprites answers, so a client fails at once), with
// an Extended DNS Error "Prohibited" that says it is the sandbox's
// egress policy when the query has EDNS, and is a Refusal;
// AAAA is answered empty (the sandbox has no IPv6
// route); anything else goes to the upstream resolvers, and the
// addresses of an answer are remembered as what the asked name resolved
// to for this sandbox.
func (p *Proxy) answer(q *dns.Msg) *dns.Msg {
	r := new(dns.Msg)
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery {
		return r.SetRcode(q, dns.RcodeFormatError)
	}
	qs := q.Question[0]
	name := canonName(qs.Name)
	p.mu.Lock()
	pol := p.policy
	p.mu.Unlock()
	if pol != nil && !pol.AllowsName(name, 0) {
		p.refuse(Refusal{What: "lookup", Name: name, Why: "no entry allows the name"})
		r.SetRcode(q, dns.RcodeRefused)
		if q.IsEdns0() != nil {
			// RFC 8914's Extended DNS Error says why, to a client that
			// shows it (dig: "EDE: 18 (Prohibited)").
			r.SetEdns0(1232, false)
			r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited,
				ExtraText: "managoat: the sandbox's egress policy does not allow " + clip(name)})
		}
		return r
	}
	if qs.Qtype == dns.TypeAAAA {
		return r.SetReply(q)
	}
	up := new(dns.Msg)
	up.Id = dns.Id()
	up.RecursionDesired = true
	up.Question = []dns.Question{qs}
	up.SetEdns0(4096, false)
	resp, err := p.exchange(up)
	if err != nil {
		return r.SetRcode(q, dns.RcodeServerFailure)
	}
	resp.Id = q.Id
	now := time.Now()
	var addrs []netip.Addr
	var ttls []uint32
	var keep []dns.RR
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ad, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ad)
				ttls = append(ttls, a.Hdr.Ttl)
			}
		}
		if _, v6 := rr.(*dns.AAAA); !v6 {
			keep = append(keep, rr)
		}
	}
	resp.Answer = keep
	if len(addrs) > 0 {
		p.mu.Lock()
		for i, a := range addrs {
			p.rememberLocked(a, name, now.Add(time.Duration(ttls[i])*time.Second+resolvedGrace))
		}
		// The answer goes out only once its addresses pass the packet
		// filter: a client connects as soon as it has it.
		var err error
		if p.policy != nil && p.policy.AllowsName(name, 0) && !p.closed {
			err = p.ns.nft.addHosts(addrs)
		}
		p.mu.Unlock()
		if err != nil {
			return r.SetRcode(q, dns.RcodeServerFailure)
		}
	}
	return resp
}

func (p *Proxy) rememberLocked(a netip.Addr, name string, until time.Time) {
	if p.nres >= maxResolved {
		now := time.Now()
		for ad, names := range p.resolved {
			for n, t := range names {
				if t.Before(now) {
					delete(names, n)
					p.nres--
				}
			}
			if len(names) == 0 {
				delete(p.resolved, ad)
			}
		}
		if p.nres >= maxResolved {
			return
		}
	}
	m := p.resolved[a]
	if m == nil {
		m = map[string]time.Time{}
		p.resolved[a] = m
	}
	if _, ok := m[name]; !ok {
		p.nres++
	}
	m[name] = until
}

// exchange asks the upstream resolvers in turn (UDP, then TCP when the
// answer was truncated).
func (p *Proxy) exchange(m *dns.Msg) (*dns.Msg, error) {
	err := errors.New("no upstream resolver")
	for _, srv := range p.cfg.Resolvers {
		var r *dns.Msg
		if r, err = p.exchangeOne("udp4", srv, m); err == nil && r.Truncated {
			r, err = p.exchangeOne("tcp4", srv, m)
		}
		if err == nil {
			return r, nil
		}
	}
	return nil, err
}

func (p *Proxy) exchangeOne(network, srv string, m *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := p.cfg.Dial(ctx, network, srv)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	dc := &dns.Conn{Conn: c, UDPSize: 4096}
	if err := dc.WriteMsg(m); err != nil {
		return nil, err
	}
	for {
		r, err := dc.ReadMsg()
		if err != nil {
			return nil, err
		}
		if r.Id == m.Id {
			return r, nil
		}
	}
}
