// Command testsweep ends what test enclosures of dead guards left on this
// host (see internal/testenv's Enclose and Sweep): every process in their
// cgroups is killed, the cgroups removed, and with their last process
// their mount namespaces and mounts go. Every enclosed test binary sweeps
// so when it starts; run this after killing go test to sweep at once:
//
//	go run ./internal/testsweep
//
// It prints each cgroup it removed and exits 1 if one could not be.
package main

import (
	"fmt"
	"os"

	"github.com/managoat/managoat/internal/testenv"
)

func main() {
	removed, err := testenv.Sweep()
	for _, r := range removed {
		fmt.Println("removed", r)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsweep:", err)
		os.Exit(1)
	}
}
