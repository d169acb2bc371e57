package spritesdoor

import (
	"encoding/json"
	"net/http"

	"github.com/managoat/managoat/sandbox"
)

// Sprites' network policy (GET and POST policy/network) onto the
// platform's allow list: allow rules naming domains become the list, a
// standalone or final deny of "*" is the list's own default, one allow
// of "*" (or no rules, which Sprites reads as allow-all) is the open
// internet (Allow ["0.0.0.0/0"]). A deny of some domains with the rest
// open, and include rules, are what an allow list cannot say: refused
// (400 invalid_policy) rather than approximated. The rules last applied
// are kept by the door for GET.

type rule struct {
	Domain  string `json:"domain,omitempty"`
	Action  string `json:"action,omitempty"`
	Include string `json:"include,omitempty"`
}

// allowOf maps rules onto an allow list.
func allowOf(rules []rule) ([]string, string) {
	if len(rules) == 0 || (len(rules) == 1 && rules[0].Domain == "*" && rules[0].Action == "allow") {
		return []string{"0.0.0.0/0"}, ""
	}
	allow := []string{}
	for i, r := range rules {
		switch {
		case r.Include != "":
			return nil, "include rules are not supported by managoat's Sprites front door"
		case r.Domain == "*" && r.Action == "deny" && i == len(rules)-1:
		case r.Action == "allow" && r.Domain != "" && r.Domain != "*":
			allow = append(allow, r.Domain)
		case r.Action == "deny":
			return nil, "a deny rule of some domains (the rest open) is not something an allow list can hold"
		default:
			return nil, "each rule needs a domain and an action (allow or deny)"
		}
	}
	return allow, ""
}

func (c *call) policy(w http.ResponseWriter, r *http.Request) {
	mk := metaKey(c.key, c.name)
	if r.Method == http.MethodGet {
		c.d.mu.Lock()
		var rules []rule
		if m := c.d.meta[mk]; m != nil {
			rules = m.Rules
		}
		c.d.mu.Unlock()
		if rules == nil {
			rules = []rule{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"rules": rules})
		return
	}
	if r.Method != http.MethodPost {
		apiErr(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method)
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Rules *[]rule `json:"rules"`
	}
	if json.Unmarshal(body, &req) != nil || req.Rules == nil {
		apiErr(w, http.StatusBadRequest, "invalid_policy", "rules are required")
		return
	}
	allow, bad := allowOf(*req.Rules)
	if bad != "" {
		apiErr(w, http.StatusBadRequest, "invalid_policy", bad)
		return
	}
	if err := c.p.ApplyNetworkPolicy(r.Context(), c.h, sandbox.NetworkPolicy{Allow: allow}); err != nil {
		st, code, msg := statusOf(err)
		if st == http.StatusBadRequest {
			code = "invalid_policy"
		}
		apiErr(w, st, code, msg)
		return
	}
	c.d.mu.Lock()
	m := c.d.meta[mk]
	if m == nil {
		m = &meta{Auth: "sprite"}
		c.d.meta[mk] = m
	}
	m.Rules = *req.Rules
	c.d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
