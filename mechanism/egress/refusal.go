package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Refusal is one thing a sandbox asked for that its policy refused: a
// lookup of a name no entry allows (answered REFUSED), a connection no
// entry allows (reset), or a plain HTTP request on an allowed connection
// that names another host (answered 403). As root a connection to an
// address no entry and no resolved allowed name can allow is refused at
// connect by the packet filter, before this process sees it: its
// lookup, when the sandbox made one through its resolver, is the
// refusal it leaves.
type Refusal struct {
	Time time.Time
	What string         // "lookup", "connection" or "request"
	Name string         // the name asked for or presented ("" for none)
	Dst  netip.AddrPort // where the connection went (zero for a lookup)
	Why  string
}

// String is one line of printable ASCII (what the sandbox sent is
// bounded, and its other bytes are shown as '?').
func (r Refusal) String() string {
	s := r.Time.UTC().Format(time.RFC3339) + " refused " + r.What
	if r.Name != "" {
		s += " " + clip(r.Name)
	}
	if r.Dst.IsValid() {
		s += " to " + r.Dst.String()
	}
	if r.Why != "" {
		s += ": " + r.Why
	}
	return strings.Map(func(c rune) rune {
		if c < 0x20 || c >= 0x7f {
			return '?'
		}
		return c
	}, s)
}

// maxRefusals is how many of the latest refusals a proxy keeps.
const maxRefusals = 32

// refusals are a proxy's latest refusals, and the bound on how often it
// tells Config.OnRefusal (a sandbox that asks for denied names in a
// loop is not a loop of log lines).
type refusals struct {
	lim     *rate.Limiter
	ring    [maxRefusals]Refusal
	n       int     // how many were ever refused
	dropped int     // not told since the last one told, past the rate
	last    Refusal // the last one told
}

// repeatWithin is how long a refusal like the last one told (the same
// kind, name and destination: a resolver's retries, A then AAAA) is not
// told again.
const repeatWithin = 10 * time.Second

func newRefusals() refusals { return refusals{lim: rate.NewLimiter(10, 50)} }

// refuse records a refusal and tells Config.OnRefusal, within its rate
// (a refusal past it is counted, and said with the next one told), unless
// it repeats the last one told.
func (p *Proxy) refuse(r Refusal) {
	r.Time = time.Now()
	p.mu.Lock()
	rs := &p.refused
	rs.ring[rs.n%maxRefusals] = r
	rs.n++
	repeat := rs.last.What == r.What && rs.last.Name == r.Name && rs.last.Dst == r.Dst && r.Time.Sub(rs.last.Time) < repeatWithin
	tell := p.cfg.OnRefusal != nil && !repeat && rs.lim.Allow()
	dropped := rs.dropped
	switch {
	case tell:
		rs.dropped, rs.last = 0, r
	case !repeat:
		rs.dropped++
	}
	p.mu.Unlock()
	if tell {
		if dropped > 0 {
			r.Why += fmt.Sprintf(" (and %d refusals not told before this one)", dropped)
		}
		p.cfg.OnRefusal(r)
	}
}

// Refusals returns the latest refusals (at most 32), oldest first, and
// how many there were in all.
func (p *Proxy) Refusals() ([]Refusal, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := &p.refused
	var out []Refusal
	for i := max(0, rs.n-maxRefusals); i < rs.n; i++ {
		out = append(out, rs.ring[i%maxRefusals])
	}
	return out, rs.n
}
