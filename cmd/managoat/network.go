package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

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
