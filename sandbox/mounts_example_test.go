package sandbox_test

import (
	"fmt"

	"github.com/managoat/managoat/sandbox"
)

// ExampleCheckNoMounts: a provider that cannot bind host paths into its
// sandboxes refuses a Create with mounts by name, never drops them.
func ExampleCheckNoMounts() {
	opts := sandbox.CreateOptions{Mounts: []sandbox.Mount{{Source: "/srv/data", Target: "/data", ReadOnly: true}}}
	err := sandbox.CheckNoMounts("e2b", opts)
	fmt.Println(sandbox.Kind(err))
	fmt.Println(err)
	// Output:
	// not_supported
	// sandbox: operation not supported: provider e2b cannot bind host paths into a sandbox (CreateOptions.Mounts [/srv/data:/data:ro], run -v); mounts are the local provider's
}
