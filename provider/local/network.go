package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

// networkOf maps CreateOptions.Network to the mechanism's Spec.Network
// ("" is the mechanism's default: egress where it provides it).
func networkOf(n string) (string, error) {
	switch n {
	case "":
		return "", nil
	case sandbox.NetworkEgress:
		return mechanism.NetworkEgress, nil
	case sandbox.NetworkNone:
		return mechanism.NetworkNone, nil
	}
	return "", sandbox.Invalid("network", "network "+quote(n)+" is neither egress nor none")
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return `"` + s + `"`
}

// enforcesEgress reports whether m enforces a per-connection allow list
// (the jail, rootless too where nsenter is; oci/runc as root): only then
// is network_policy advertised.
func enforcesEgress(m mechanism.Mechanism) bool {
	if _, ok := m.(mechanism.EgressUpdater); !ok {
		return false
	}
	return slices.Contains(mechanism.Constructed(m), mechanism.EgressAllowlist) &&
		slices.Contains(mechanism.Guaranteed(m), mechanism.EgressAllowlist)
}

// checkPolicy refuses a list the mechanism's proxy would not parse:
// Invalid{egress_allowlist} naming the entry, or the limit; and an IPv6
// address or CIDR, which would allow nothing (a sandbox has no IPv6
// egress), rather than take it silently.
func checkPolicy(allow []string) error {
	if _, err := egress.ParsePolicy(allow); err != nil {
		var ie *mechanism.InvalidError
		if errors.As(err, &ie) {
			return sandbox.Invalid("egress_allowlist", ie.Reason)
		}
		return sandbox.Invalid("egress_allowlist", err.Error())
	}
	for _, e := range allow {
		host := e
		if h, _, err := net.SplitHostPort(e); err == nil && strings.HasPrefix(e, "[") {
			host = h
		}
		a, err := netip.ParseAddr(host)
		if err != nil {
			var pr netip.Prefix
			if pr, err = netip.ParsePrefix(host); err == nil {
				a = pr.Addr()
			}
		}
		if err == nil && a.Is6() && !a.Is4In6() {
			return sandbox.Invalid("egress_allowlist", fmt.Sprintf("%s is IPv6: a local sandbox's egress is IPv4 only, so it would allow nothing", quote(e)))
		}
	}
	return nil
}

// egressEntries is the list the mechanism is given: the same entries
// (a domain without a port allows every port, as Sprites' rules do).
func egressEntries(allow []string) []string {
	return append([]string{}, allow...)
}

// publishes reports whether m publishes sandboxes' ports on the host's
// loopback (the jail, rootless too where nsenter is; oci/runc as root):
// only then is public_url advertised.
func publishes(m mechanism.Mechanism) bool {
	_, ok := m.(mechanism.Addresser)
	return ok && enforcesEgress(m)
}

// publishOf checks CreateOptions.Publish: Invalid{publish} on a mechanism
// that publishes nothing, or for a bad port.
func (p *Provider) publishOf(ports []int) ([]int, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	if !publishes(p.mech) {
		return nil, sandbox.Invalid("publish", "mechanism "+p.mech.Name()+" publishes no ports here (the jail does, rootless too with util-linux's nsenter; oci/runc as root)")
	}
	spec := mechanism.Spec{Publish: ports}
	if err := spec.Validate(); err != nil {
		var ie *mechanism.InvalidError
		if errors.As(err, &ie) {
			return nil, sandbox.Invalid("publish", ie.Reason)
		}
		return nil, sandbox.Invalid("publish", err.Error())
	}
	return append([]int{}, ports...), nil
}

// publicURL is http://ADDRESS of r's first published port: never an
// address another machine can reach, and one that relays only this
// user's (and root's) connections: another local user's are reset
// (egress.Published). A sandbox that publishes nothing is
// Invalid{no_published_port}; one that is not running is
// Unavailable{not_running}.
func (p *Provider) publicURL(ctx context.Context, r *record) (string, error) {
	m, err := p.mechFor(r)
	if err != nil {
		return "", mechErr("url", err)
	}
	if !publishes(m) {
		return "", sandbox.ErrUnsupported
	}
	if len(r.Publish) == 0 {
		return "", sandbox.Invalid("no_published_port", "the sandbox publishes no port: create it with Publish (managoat create --publish PORT)")
	}
	addr, err := mechanism.Address(ctx, m, r.InstanceID, r.Publish[0])
	if err != nil {
		return "", mechErr("url", err)
	}
	if addr == "" {
		return "", sandbox.Unavailable("not_running", fmt.Errorf("sandbox %s is not running: its port %d is published only while it runs", r.Name, r.Publish[0]))
	}
	return "http://" + addr, nil
}

// PublishedPorts are the ports the sandbox h publishes
// (CreateOptions.Publish), in order; none is an empty list. With
// PortAddress it is what a platform on this host proxies (platform/api).
func (p *Provider) PublishedPorts(ctx context.Context, h *sandbox.Handle) ([]int, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	return append([]int{}, r.Publish...), nil
}

// PortAddress is where port of the sandbox h is published while it
// runs, for a platform on this host to proxy: "unix:PATH", the published
// port's unix socket (mode 0600 in a directory of this user's, 0700:
// egress.SocketFor), which no other local user can connect to; or, for
// a port published by an older managoat that made no socket, its
// loopback address "127.0.0.1:PORT". A port h does not publish is
// Invalid{port}; a sandbox that is not running, or is suspended (its
// application would not answer), is Unavailable{not_running}. It starts
// nothing and reads files only.
func (p *Provider) PortAddress(ctx context.Context, h *sandbox.Handle, port int) (string, error) {
	r, dir, err := p.handle(h)
	if err != nil {
		return "", err
	}
	if !slices.Contains(r.Publish, port) {
		return "", sandbox.Invalid("port", fmt.Sprintf("sandbox %s does not publish port %d (it publishes %v)", r.Name, port, r.Publish))
	}
	m, err := p.mechFor(r)
	if err != nil {
		return "", mechErr("url", err)
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedName)); err == nil {
		return "", sandbox.Unavailable("not_running", fmt.Errorf("sandbox %s is suspended: resume it to reach its port %d", r.Name, port))
	}
	addr, err := mechanism.Address(ctx, m, r.InstanceID, port)
	if err != nil {
		return "", mechErr("url", err)
	}
	if addr == "" {
		return "", sandbox.Unavailable("not_running", fmt.Errorf("sandbox %s is not running: its port %d is published only while it runs", r.Name, port))
	}
	if sock, err := egress.SocketFor(addr); err == nil {
		return "unix:" + sock, nil
	}
	return addr, nil
}

// refusalPrefix starts each line a sandbox's egress writes to its
// supervisor's log (sup.log) for what its policy refused.
const refusalPrefix = "managoat egress: "

// egressConfig is the egress of the mechanisms this provider opens: what
// a sandbox's policy refuses is a line on stderr, which in the sandbox's
// supervisor (where its proxy runs) is the sandbox's sup.log, read back
// by Get (egress_refused).
func egressConfig() egress.Config {
	return egress.Config{OnRefusal: func(r egress.Refusal) {
		fmt.Fprintln(os.Stderr, refusalPrefix+r.String())
	}}
}

// maxRefusedShown is how many of the latest refusals Get reports.
const maxRefusedShown = 10

// policyJSON adds the sandbox's network policy to Get's raw: "network"
// when it was chosen, "egress_allow" the allow list in force (absent: no
// list, every public destination; empty: nothing), and "egress_refused"
// the latest refusals its supervisor's log holds (from its last 64 KiB).
func policyJSON(r *record, dir string, raw map[string]any) {
	if r.Network != "" {
		raw["network"] = r.Network
	}
	if allow, ok := readPolicy(dir); ok {
		if allow == nil {
			allow = []string{}
		}
		raw["egress_allow"] = allow
	}
	f, err := os.Open(filepath.Join(dir, supervisor.LogName))
	if err != nil {
		return
	}
	defer f.Close()
	const tail = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		f.Seek(fi.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, tail))
	var refused []string
	for _, l := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(l, refusalPrefix); ok {
			refused = append(refused, s)
		}
	}
	if len(refused) > maxRefusedShown {
		refused = refused[len(refused)-maxRefusedShown:]
	}
	if len(refused) > 0 {
		raw["egress_refused"] = refused
	}
}
