//go:build !amd64

package hostfacts

import (
	"fmt"
	"os"
)

func runRole(spec string) {
	fmt.Printf("%s: no i386 interface on this architecture\n", Role)
	os.Exit(2)
}
