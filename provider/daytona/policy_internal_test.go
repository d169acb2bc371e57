package daytona

import "testing"

// The hosted service's runners enforce domainAllowList (its documentation,
// https://www.daytona.io/docs/network-limits/; the runner is not public);
// the public-source runner (apps/runner pkg/docker/network.go, v0.190.0)
// never reads it. So only the hosted URL, or an installation that says so,
// takes an allow-list.
func TestWhoEnforcesDomainAllowLists(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{Config{APIKey: "k"}, true},
		{Config{APIKey: "k", APIURL: DefaultAPIURL + "/"}, true},
		{Config{APIKey: "k", APIURL: "https://daytona.internal/api"}, false},
		{Config{APIKey: "k", APIURL: "https://daytona.internal/api", DomainAllowListEnforced: true}, true},
	} {
		p, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.enforcesDomains(); got != tc.want {
			t.Errorf("%q (enforced %v): enforcesDomains = %v, want %v", tc.cfg.APIURL, tc.cfg.DomainAllowListEnforced, got, tc.want)
		}
	}
}
