package e2bdoor

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// E2B's network settings (create's network and allow_internet_access, PUT
// /sandboxes/{id}/network, the SDK's updateNetwork) onto the platform's
// network policy, which is an allow list (sandbox.NetworkPolicy): E2B's
// usual form, denyOut ["0.0.0.0/0"] (or allow_internet_access false) with
// allowOut exceptions, becomes Allow = allowOut; no denyOut at all is the
// open internet (Allow ["0.0.0.0/0"] on an update, no policy on a
// create). A denyOut of part of the internet with the rest open is what an
// allow list cannot say, and is refused (400) rather than approximated, as
// are rules (header transforms) and an egress proxy.

// allTraffic is E2B's ALL_TRAFFIC selector.
const allTraffic = "0.0.0.0/0"

type networkReq struct {
	AllowOut    []string        `json:"allowOut"`
	DenyOut     []string        `json:"denyOut"`
	Rules       json.RawMessage `json:"rules"`
	EgressProxy json.RawMessage `json:"egressProxy"`
	Internet    *bool           `json:"allow_internet_access"`
}

// policyOf maps E2B's settings onto an allow list; open reports the open
// internet (no list needed on a create).
func policyOf(n networkReq) (allow []string, open bool, err error) {
	if len(n.Rules) > 0 && string(n.Rules) != "null" && string(n.Rules) != "{}" {
		return nil, false, errors.New("network rules (request transforms) are not supported by managoat's E2B front door")
	}
	if len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null" {
		return nil, false, errors.New("an egress proxy is not supported by managoat's E2B front door")
	}
	if len(n.AllowOut) > 256 || len(n.DenyOut) > 256 {
		return nil, false, errors.New("at most 256 allowOut and 256 denyOut entries")
	}
	for _, e := range n.AllowOut {
		if err := sandbox.CheckAllowEntry(e); err != nil {
			return nil, false, err
		}
	}
	denyAll := n.Internet != nil && !*n.Internet || slices.Contains(n.DenyOut, allTraffic)
	switch {
	case denyAll:
		return append([]string{}, n.AllowOut...), false, nil
	case len(n.DenyOut) > 0:
		return nil, false, errors.New("denyOut of part of the internet with the rest open is not supported: managoat's network policy is an allow list; deny " + allTraffic + " and list what to allow in allowOut")
	}
	return []string{allTraffic}, true, nil
}

// updateNetwork is PUT /sandboxes/{id}/network.
func (d *Door) updateNetwork(w http.ResponseWriter, r *http.Request, p *client.Client, h *sandbox.Handle, body []byte) {
	var n networkReq
	if err := json.Unmarshal(body, &n); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	allow, _, err := policyOf(n)
	if err != nil {
		apiErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := p.ApplyNetworkPolicy(r.Context(), h, sandbox.NetworkPolicy{Allow: allow}); err != nil {
		st, msg := statusOf(err)
		apiErr(w, st, msg)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
