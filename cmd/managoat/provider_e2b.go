package main

import (
	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/sandbox"
)

// E2B is configured from E2B_API_KEY (required), E2B_DOMAIN (a team's own
// cluster: the control plane is https://api.<domain> and envd is reached
// under the domain too, unless the sandbox names its own), E2B_API_URL (or
// E2B_BASE_URL), E2B_SANDBOX_URL, E2B_TEMPLATE and E2B_USER; asking for it
// without a key is an error that names E2B_API_KEY.
func init() {
	registerProvider("e2b", func() (sandbox.Provider, error) { return e2b.NewFromEnv() })
}
