package main

import (
	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/sandbox"
)

// Daytona is configured from DAYTONA_API_KEY (required), DAYTONA_API_URL
// (self-hosted installations), DAYTONA_SNAPSHOT and
// DAYTONA_DOMAIN_ALLOWLIST_ENFORCED (1 or true: this installation's runners
// enforce domain allow-lists; see daytona.Config.DomainAllowListEnforced);
// asking for it without a key is an error that names DAYTONA_API_KEY.
func init() {
	registerProvider("daytona", func() (sandbox.Provider, error) { return daytona.NewFromEnv() })
}
