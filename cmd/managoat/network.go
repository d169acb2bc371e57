package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
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
type policyFlags struct {
	allow multiFlag
	deny  string
}

func (f *policyFlags) add(fs *flag.FlagSet) {
	fs.Var(&f.allow, "allow", "the only egress the sandbox gets: comma-separated `DOMAIN|CIDR` entries (example.com, *.example.com, 10.0.0.0/8, each optionally :PORT; repeatable); --allow \"\" denies all")
	fs.StringVar(&f.deny, "deny", "", "--deny all denies all egress (the same as --allow \"\"); a list names what is allowed, everything else is denied")
}

// policy is the NetworkPolicy the flags ask for, and whether they ask
// for one; an entry that is neither a domain nor an address or CIDR is
// refused before anything is made.
func (f *policyFlags) policy(fs *flag.FlagSet) (sandbox.NetworkPolicy, bool, error) {
	given := false
	fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == "allow" || fl.Name == "deny" })
	if !given {
		return sandbox.NetworkPolicy{}, false, nil
	}
	pol := sandbox.NetworkPolicy{Allow: []string{}}
	switch f.deny {
	case "":
	case "all":
		if len(f.allow) > 0 {
			return pol, false, usageError{msg: "--deny all and --allow contradict each other: --allow alone names all that is allowed"}
		}
		return pol, true, nil
	default:
		return pol, false, usageError{msg: fmt.Sprintf("--deny %q: --deny takes all (deny all egress); to allow only some destinations name them with --allow, everything else is denied", f.deny)}
	}
	for _, a := range f.allow {
		for _, e := range strings.Split(a, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			if err := sandbox.CheckAllowEntry(e); err != nil {
				return pol, false, err
			}
			pol.Allow = append(pol.Allow, e)
		}
	}
	return pol, true, nil
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
