package egress_test

import (
	"fmt"
	"net/netip"

	"github.com/managoat/managoat/mechanism/egress"
)

func ExampleParsePolicy() {
	pol, err := egress.ParsePolicy([]string{"github.com", "*.pythonhosted.org:443", "203.0.113.0/24"})
	if err != nil {
		panic(err)
	}
	fmt.Println(pol.AllowsName("github.com", 443), pol.AllowsName("files.pythonhosted.org", 443), pol.AllowsName("pythonhosted.org", 443))
	fmt.Println(pol.AllowsAddr(netip.MustParseAddr("203.0.113.9"), 22), pol.AllowsAddr(netip.MustParseAddr("198.51.100.1"), 443))
	_, err = egress.ParsePolicy([]string{"github.com", "http://example.com/"})
	fmt.Println(err)
	// Output:
	// true true false
	// true false
	// mechanism: invalid allow: "http://example.com/" is neither a domain (example.com, *.example.com) nor an address or CIDR, each optionally with :port (port "//example.com/")
}

// Attach gives a running sandbox (its init is pid) the outside world
// under a policy: as root, or as the user owning the sandbox's user
// namespace (a rootless sandbox).
func ExampleAttach() {
	pid := 12345 // the sandbox's init
	pol, _ := egress.ParsePolicy([]string{"github.com"})
	p, err := egress.Attach(pid, pol, egress.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	p.SetPolicy(nil) // every public destination, from the next connection on
}

// RootlessSupported says whether a manager that is not root can give its
// sandboxes egress on this host, and if not, why.
func ExampleRootlessSupported() {
	if ok, why := egress.RootlessSupported(); !ok {
		fmt.Println("rootless sandboxes get only lo:", why)
		return
	}
	fmt.Println("rootless sandboxes get egress")
}
