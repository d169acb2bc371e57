package egress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// alwaysDenied are the destinations no policy opens: this host's and the
// sandbox's loopback, link-local (the cloud metadata address
// 169.254.169.254 among them), "this network", multicast, reserved and
// broadcast.
var alwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("224.0.0.0/3"), // multicast, reserved, broadcast
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// privateRanges are denied unless Config.AllowPrivate: the ranges a
// host's own networks (and its neighbours, a cloud VPC, a home LAN) use.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("fc00::/7"),
}

// hostAddrs caches this host's interface addresses for a second: no
// policy reaches them (a service bound to 0.0.0.0 on the host is the
// host's, not the internet's).
type hostAddrs struct {
	mu   sync.Mutex
	at   time.Time
	list []netip.Addr
}

var hostCache hostAddrs

func (h *hostAddrs) get() []netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) < time.Second && h.list != nil {
		return h.list
	}
	var out []netip.Addr
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ad, ok := netip.AddrFromSlice(ipn.IP); ok {
					out = append(out, ad.Unmap())
				}
			}
		}
	}
	h.list, h.at = out, time.Now()
	return out
}

// forbidden reports why addr may never be reached from a sandbox, or "".
func forbidden(addr netip.Addr, allowPrivate bool) string {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return "invalid address"
	}
	for _, p := range alwaysDenied {
		if p.Contains(addr) {
			return "loopback, link-local, multicast or reserved"
		}
	}
	if !allowPrivate {
		for _, p := range privateRanges {
			if p.Contains(addr) {
				return "a private range"
			}
		}
	}
	for _, h := range hostCache.get() {
		if h == addr {
			return "an address of this host"
		}
	}
	return ""
}

// deniedPrefixes is what the sandbox's own packet filter rejects at
// connect (IPv4; the sandbox has no IPv6 route): the always-denied
// ranges, the private ones unless allowPrivate, and this host's
// addresses now.
func deniedPrefixes(allowPrivate bool) []netip.Prefix {
	var out []netip.Prefix
	add := func(ps []netip.Prefix) {
		for _, p := range ps {
			if p.Addr().Is4() {
				out = append(out, p)
			}
		}
	}
	add(alwaysDenied)
	if !allowPrivate {
		add(privateRanges)
	}
	for _, h := range hostCache.get() {
		if h.Is4() {
			out = append(out, netip.PrefixFrom(h, 32))
		}
	}
	return out
}
