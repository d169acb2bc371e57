package oci_test

import (
	"fmt"
	"os"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/oci"
)

// The CLI's --mechanism names map to a runtime; New builds the mechanism
// (a runtime that is not installed is refused later, at Provision).
func ExampleParseName() {
	for _, name := range []string{"oci", "oci:runsc", "jail"} {
		rt, ok := oci.ParseName(name)
		fmt.Printf("%s -> %q %v\n", name, rt, ok)
	}
	// Output:
	// oci -> "runc" true
	// oci:runsc -> "runsc" true
	// jail -> "" false
}

func ExampleNew() {
	dir, _ := os.MkdirTemp("", "oci-example-")
	defer os.RemoveAll(dir)
	m, err := oci.New(oci.Config{Runtime: "runsc", StateDir: dir})
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Name())
	// What it builds itself, whatever the host (egress_allowlist and
	// disk_quota are added where the host allows them).
	fmt.Println(mechanism.Constructed(m)[:7])
	// Output:
	// oci/runsc
	// [process_separation filesystem_confinement privilege_separation network_restriction syscall_filter time_budget host_mounts]
}
