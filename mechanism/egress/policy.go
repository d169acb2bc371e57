package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/managoat/managoat/mechanism"
)

// MaxEntries is the most allow entries a Policy takes; a longer list is
// invalid (every new connection is checked against the list, and the
// list is kept per sandbox).
const MaxEntries = 1024

// Policy is a parsed allow list. The zero Policy allows nothing. A nil
// *Policy is "no allow list": every public destination is allowed.
type Policy struct {
	domains []domainRule
	cidrs   []cidrRule
	raw     []string
}

type domainRule struct {
	name     string // lower case, no trailing dot; for a wildcard the suffix without "*."
	wildcard bool   // *.name: strict subdomains of name, never name itself
	port     uint16 // 0: any port
}

type cidrRule struct {
	prefix netip.Prefix
	port   uint16
}

// ParsePolicy parses an allow list. Each entry is one of
//
//	example.com          a domain, exactly (any port)
//	*.example.com        every subdomain of example.com (not example.com)
//	example.com:443      a domain on one port (also *.example.com:443)
//	203.0.113.7          one address (IPv4 or IPv6)
//	203.0.113.0/24       a CIDR
//	203.0.113.0/24:443   a CIDR or address on one port ([2001:db8::/32]:443 for IPv6)
//
// An entry that is none of these is an *mechanism.InvalidError naming
// it, and so is a list longer than MaxEntries. An empty list is valid:
// it allows nothing.
func ParsePolicy(allow []string) (*Policy, error) {
	if len(allow) > MaxEntries {
		return nil, mechanism.Invalid("allow", fmt.Sprintf("%d entries: at most %d are accepted", len(allow), MaxEntries))
	}
	p := &Policy{raw: append([]string{}, allow...)}
	for _, e := range allow {
		if err := p.add(e); err != nil {
			return nil, mechanism.Invalid("allow", fmt.Sprintf("%q is neither a domain (example.com, *.example.com) nor an address or CIDR, each optionally with :port (%v)", e, err))
		}
	}
	return p, nil
}

// Entries returns the list p was parsed from.
func (p *Policy) Entries() []string {
	if p == nil {
		return nil
	}
	return append([]string{}, p.raw...)
}

func (p *Policy) add(e string) error {
	if e == "" || len(e) > 300 {
		return fmt.Errorf("length %d", len(e))
	}
	host, port := e, uint16(0)
	if strings.HasPrefix(e, "[") { // [v6 or v6/len]:port
		i := strings.Index(e, "]")
		if i < 0 {
			return fmt.Errorf("unclosed [")
		}
		host = e[1:i]
		rest := e[i+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return fmt.Errorf("junk after ]")
			}
			n, err := parsePort(rest[1:])
			if err != nil {
				return err
			}
			port = n
		}
	} else if strings.Count(e, ":") == 1 {
		h, ps, _ := strings.Cut(e, ":")
		n, err := parsePort(ps)
		if err != nil {
			return err
		}
		host, port = h, n
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		p.cidrs = append(p.cidrs, cidrRule{netip.PrefixFrom(a, a.BitLen()), port})
		return nil
	}
	if pr, err := netip.ParsePrefix(host); err == nil {
		if pr.Addr().Is4In6() {
			if pr.Bits() < 96 {
				return fmt.Errorf("mapped prefix shorter than /96")
			}
			pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
		}
		p.cidrs = append(p.cidrs, cidrRule{pr.Masked(), port})
		return nil
	}
	if strings.Contains(host, "/") || strings.Contains(host, ":") {
		return fmt.Errorf("not an address or prefix")
	}
	wild := strings.HasPrefix(host, "*.")
	name := strings.TrimSuffix(strings.ToLower(strings.TrimPrefix(host, "*.")), ".")
	if err := checkDomain(name); err != nil {
		return err
	}
	p.domains = append(p.domains, domainRule{name, wild, port})
	return nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q", s)
	}
	return uint16(n), nil
}

// checkDomain accepts a DNS name of letters, digits, hyphens and
// underscores in dot-separated labels, with at least two labels and a
// non-numeric last label.
func checkDomain(name string) error {
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("name length")
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return fmt.Errorf("a single label")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q", l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("character %q", r)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("numeric top label")
	}
	return nil
}

// AllowsAddr reports whether a CIDR entry allows addr:port.
func (p *Policy) AllowsAddr(addr netip.Addr, port uint16) bool {
	if p == nil {
		return true
	}
	addr = addr.Unmap()
	for _, c := range p.cidrs {
		if c.prefix.Contains(addr) && (c.port == 0 || c.port == port) {
			return true
		}
	}
	return false
}

// AllowsName reports whether a domain entry allows name on port (port
// 0: on some port, which is what the resolver asks).
func (p *Policy) AllowsName(name string, port uint16) bool {
	if p == nil {
		return true
	}
	name = canonName(name)
	for _, d := range p.domains {
		if port != 0 && d.port != 0 && d.port != port {
			continue
		}
		if d.wildcard {
			if strings.HasSuffix(name, "."+d.name) {
				return true
			}
		} else if name == d.name {
			return true
		}
	}
	return false
}

// canonName lower-cases name and drops a trailing dot.
func canonName(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}
