package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// networkFlags collects create's --network and --publish (the local
// provider's: hosted providers give egress always and a URL of their own).
type networkFlags struct {
	network string
	publish multiFlag
}

func (f *networkFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.network, "network", "", "the sandbox's network: egress (the default: the outside world, under its network policy) or none (only loopback; local provider)")
	fs.Var(&f.publish, "publish", "publish `PORT` of the sandbox on this machine's loopback, for your user only (another user's connections are reset); managoat url NAME prints http://127.0.0.1:PORT for the first, or through the platform its proxied URL (repeatable; local provider)")
}

// options checks the flags for provider and returns CreateOptions'
// Network and Publish.
func (f *networkFlags) options(provider string) (string, []int, error) {
	switch f.network {
	case "", sandbox.NetworkEgress, sandbox.NetworkNone:
	default:
		return "", nil, usageError{msg: fmt.Sprintf("--network %q: egress or none", f.network)}
	}
	var ports []int
	for _, s := range f.publish {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			return "", nil, usageError{msg: fmt.Sprintf("--publish %q: a port, 1 to 65535", s)}
		}
		ports = append(ports, n)
	}
	// Through the platform, --publish goes to serve, which proxies the
	// ports of a provider that publishes (local) and refuses the others'.
	platform := provider == "platform" || strings.HasPrefix(provider, "platform:")
	if (f.network != "" || len(ports) > 0 && !platform) && provider != "local" {
		return "", nil, &sandbox.InvalidError{Reason: "network", Msg: fmt.Sprintf("provider %s chooses its sandboxes' network itself; --network and --publish are the local provider's (--publish the platform's too)", provider)}
	}
	return f.network, ports, nil
}

// policyFlags collects --allow and --deny (create, run and policy): the
// sandbox's egress allow list, put in force as soon as the sandbox is
// made, before any command of run's runs.
//
// The policy is an allow list only (sandbox.NetworkPolicy has no deny
// list: what it does not name is denied). So --deny all is the empty
// list, and --deny ENTRY takes entries out of the --allow list: an allow
// entry a deny entry covers (the same destination, a subdomain of a
// denied *.domain, an address or CIDR inside a denied CIDR; every port of
// it, or the same port) is dropped, and a deny entry nothing allows is
// denied already. What an allow list cannot say is refused, not
// approximated: --deny ENTRY without --allow (open egress but for some
// destinations), and a deny entry inside a broader allow entry (--allow
// *.example.com --deny a.example.com, --allow 10.0.0.0/8 --deny
// 10.1.0.0/16, --allow example.com --deny example.com:22). Domains and
// addresses are not compared: --deny example.com does not touch an
// allowed CIDR its addresses are in.
type policyFlags struct {
	allow multiFlag
	deny  multiFlag
}

func (f *policyFlags) add(fs *flag.FlagSet) {
	fs.Var(&f.allow, "allow", "the only egress the sandbox gets: comma-separated `DOMAIN|CIDR` entries (example.com, *.example.com, 10.0.0.0/8, each optionally :PORT; repeatable); --allow \"\" denies all")
	fs.Var(&f.deny, "deny", "all: deny all egress (the same as --allow \"\"); or `DOMAIN|CIDR` entries taken out of the --allow list (repeatable; the policy is an allow list, so an exception inside a broader --allow entry, or --deny without --allow, is refused)")
}

// policy is the NetworkPolicy the flags ask for, and whether they ask
// for one; an entry that is neither a domain nor an address or CIDR is
// refused before anything is made.
func (f *policyFlags) policy(fs *flag.FlagSet) (sandbox.NetworkPolicy, bool, error) {
	given, allowGiven := false, false
	fs.Visit(func(fl *flag.Flag) {
		given = given || fl.Name == "allow" || fl.Name == "deny"
		allowGiven = allowGiven || fl.Name == "allow"
	})
	if !given {
		return sandbox.NetworkPolicy{}, false, nil
	}
	pol := sandbox.NetworkPolicy{Allow: []string{}}
	entries := func(vals []string) ([]string, error) {
		var out []string
		for _, a := range vals {
			for _, e := range strings.Split(a, ",") {
				if e = strings.TrimSpace(e); e == "" {
					continue
				}
				if err := sandbox.CheckAllowEntry(e); err != nil && e != "all" {
					return nil, err
				}
				out = append(out, e)
			}
		}
		return out, nil
	}
	deny, err := entries(f.deny)
	if err != nil {
		return pol, false, err
	}
	if slices.Contains(deny, "all") {
		if len(deny) > 1 || len(f.allow) > 0 {
			return pol, false, usageError{msg: "--deny all denies all egress: it takes no other --deny entry and no --allow (--allow alone names all that is allowed)"}
		}
		return pol, true, nil
	}
	if len(deny) > 0 && !allowGiven {
		return pol, false, usageError{msg: fmt.Sprintf("--deny %s without --allow: the network policy is an allow list (what it does not name is denied), so it cannot deny some destinations and allow the rest; name what is allowed with --allow (and --deny takes entries out of it), or --deny all", deny[0])}
	}
	allow, err := entries(f.allow)
	if err != nil {
		return pol, false, err
	}
	for _, e := range allow {
		if e == "all" {
			return pol, false, sandbox.CheckAllowEntry(e)
		}
	}
	kept := allow[:0:0]
next:
	for _, a := range allow {
		ea := parseEntry(a)
		for _, d := range deny {
			ed := parseEntry(d)
			if ed.covers(ea) {
				continue next // denied: dropped from the list
			}
			if ea.covers(ed) || ea.overlaps(ed) {
				return pol, false, usageError{msg: fmt.Sprintf("--deny %s is inside --allow %s: the network policy is an allow list and cannot make an exception within an entry; allow narrower entries instead", d, a)}
			}
		}
		kept = append(kept, a)
	}
	pol.Allow = append(pol.Allow, kept...)
	return pol, true, nil
}

// entry is an allow or deny entry, parsed for comparison (it passed
// sandbox.CheckAllowEntry): a domain or *.domain, or a prefix (an address
// is its /32 or /128), and a port (0: every port).
type entry struct {
	name   string // lower case, no trailing dot; for a wildcard without "*."
	wild   bool   // *.name: strict subdomains of name
	prefix netip.Prefix
	port   uint64
}

func parseEntry(e string) entry {
	host, port := e, ""
	if strings.HasPrefix(e, "[") {
		i := strings.Index(e, "]")
		host, port = e[1:i], strings.TrimPrefix(e[i+1:], ":")
	} else if strings.Count(e, ":") == 1 {
		host, port, _ = strings.Cut(e, ":")
	}
	var x entry
	x.port, _ = strconv.ParseUint(port, 10, 16)
	if a, err := netip.ParseAddr(host); err == nil {
		x.prefix = netip.PrefixFrom(a, a.BitLen())
		return x
	}
	if p, err := netip.ParsePrefix(host); err == nil {
		x.prefix = p.Masked()
		return x
	}
	x.wild = strings.HasPrefix(host, "*.")
	x.name = strings.TrimSuffix(strings.ToLower(strings.TrimPrefix(host, "*.")), ".")
	return x
}

// covers reports whether every destination of o is one of x's.
func (x entry) covers(o entry) bool {
	if x.port != 0 && x.port != o.port {
		return false
	}
	if x.prefix.IsValid() || o.prefix.IsValid() {
		return x.prefix.IsValid() && o.prefix.IsValid() && x.prefix.Bits() <= o.prefix.Bits() && x.prefix.Contains(o.prefix.Addr())
	}
	switch {
	case !x.wild:
		return !o.wild && o.name == x.name
	case o.wild:
		return o.name == x.name || strings.HasSuffix(o.name, "."+x.name)
	}
	return strings.HasSuffix(o.name, "."+x.name)
}

// overlaps reports whether x and o share a destination that neither
// holds all of (the same host, ports that only partly agree).
func (x entry) overlaps(o entry) bool {
	hx, ho := x, o
	hx.port, ho.port = 0, 0
	if !hx.covers(ho) && !ho.covers(hx) {
		return false
	}
	return x.port == 0 || o.port == 0 || x.port == o.port
}

// applyPolicy puts pol in force in the sandbox h that create or run just
// made. When it cannot, a sandbox that did not exist before (made) is
// destroyed rather than left with more egress than was asked.
func applyPolicy(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, pol sandbox.NetworkPolicy, made bool) error {
	err := reg.ApplyNetworkPolicy(ctx, h, pol)
	if err == nil || !made {
		return wrap("policy", err)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if derr := reg.Destroy(dctx, h); derr != nil {
		return wrap("policy", fmt.Errorf("%w (and destroying sandbox %s, made without it, failed: %v)", err, h.Name, derr))
	}
	return wrap("policy", fmt.Errorf("%w (sandbox %s was destroyed rather than left with more egress than asked)", err, h.Name))
}

// printPolicy prints the network policy of h as its provider reports it
// (provider/local: Get's network, egress_allow, egress_refused).
func printPolicy(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) error {
	info, err := reg.Get(ctx, h)
	if err != nil {
		return err
	}
	var raw struct {
		Mechanism string    `json:"mechanism"`
		Network   string    `json:"network"`
		Allow     *[]string `json:"egress_allow"`
		Refused   []string  `json:"egress_refused"`
	}
	_ = json.Unmarshal(info.Raw, &raw)
	switch {
	case raw.Network == sandbox.NetworkNone:
		fmt.Println("network: none (loopback only)")
	case raw.Mechanism == "trusted":
		fmt.Println("network: the host's (mechanism trusted enforces no policy)")
	case raw.Allow != nil && len(*raw.Allow) == 0:
		fmt.Println("allow: nothing (all egress denied)")
	case raw.Allow != nil:
		fmt.Println("allow: " + cell(strings.Join(*raw.Allow, ", ")))
	case raw.Mechanism != "":
		fmt.Println("allow: every public destination (no allow list)")
	default:
		fmt.Printf("provider %s does not say which policy is in force\n", h.Provider)
	}
	if len(raw.Refused) > 0 {
		fmt.Println("refused lately:")
		for _, r := range raw.Refused {
			fmt.Println("  " + cell(r))
		}
	}
	return nil
}
