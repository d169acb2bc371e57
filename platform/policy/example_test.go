package policy_test

import (
	"fmt"

	"github.com/managoat/managoat/platform/policy"
)

func ExampleFromEnv() {
	environ := map[string]string{"E2B_API_KEY": "…", "SANDBOX_RUNNERS_ENABLED": "false"}
	lookup := func(k string) (string, bool) { v, ok := environ[k]; return v, ok }
	pol, err := policy.FromEnv(lookup, policy.Options{LocalProbe: func() error { return nil }})
	if err != nil {
		panic(err) // a host refuses to start here
	}
	fmt.Println(pol.EnabledNames(), pol.Default())
	_, err = pol.Choose("daytona")
	fmt.Println(err)
	// Output:
	// [local e2b] local
	// sandbox: invalid provider: provider "daytona" is not enabled on this platform: DAYTONA_API_KEY is not set
}
