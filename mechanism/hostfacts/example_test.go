package hostfacts_test

import (
	"fmt"

	"github.com/managoat/managoat/mechanism/hostfacts"
)

// A test that depends on a kernel feature asks for the fact and takes the
// path this host allows, instead of failing where the feature is
// configured off.
func ExampleHas() {
	if hostfacts.Has(hostfacts.IA32) {
		fmt.Println("i386 system calls run here: try each one against the filter")
	} else {
		fmt.Println("no i386 system call runs here: check that int $0x80 ends its process")
	}
}

func ExampleAll() {
	for _, f := range hostfacts.All() {
		_ = f.Present // and f.Detail, the evidence; f.Affects, what depends on it
	}
	fmt.Println(len(hostfacts.All()) == len(hostfacts.Names()))
	// Output: true
}
