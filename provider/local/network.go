package local

import (
	"errors"
	"slices"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
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
// (the jail as root): only then is network_policy advertised.
func enforcesEgress(m mechanism.Mechanism) bool {
	if _, ok := m.(mechanism.EgressUpdater); !ok {
		return false
	}
	return slices.Contains(mechanism.Constructed(m), mechanism.EgressAllowlist) &&
		slices.Contains(mechanism.Guaranteed(m), mechanism.EgressAllowlist)
}

// checkPolicy refuses a list the mechanism's proxy would not parse:
// Invalid{egress_allowlist} naming the entry, or the limit.
func checkPolicy(allow []string) error {
	if _, err := egress.ParsePolicy(allow); err != nil {
		var ie *mechanism.InvalidError
		if errors.As(err, &ie) {
			return sandbox.Invalid("egress_allowlist", ie.Reason)
		}
		return sandbox.Invalid("egress_allowlist", err.Error())
	}
	return nil
}

// egressEntries is the list the mechanism is given: the same entries
// (a domain without a port allows every port, as Sprites' rules do).
func egressEntries(allow []string) []string {
	return append([]string{}, allow...)
}
