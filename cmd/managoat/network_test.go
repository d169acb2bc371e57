package main

import (
	"errors"
	"flag"
	"slices"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

func TestNetworkFlags(t *testing.T) {
	parse := func(args ...string) *networkFlags {
		var nf networkFlags
		fs := flag.NewFlagSet("create", flag.ContinueOnError)
		nf.add(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &nf
	}
	n, ports, err := parse("--network", "none", "--publish", "8080", "--publish", "9000").options("local")
	if err != nil || n != sandbox.NetworkNone || !slices.Equal(ports, []int{8080, 9000}) {
		t.Fatalf("options = %q %v %v", n, ports, err)
	}
	for _, args := range [][]string{{"--network", "bridge"}, {"--publish", "0"}, {"--publish", "http"}, {"--publish", "70000"}} {
		if _, _, err := parse(args...).options("local"); !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	var ie *sandbox.InvalidError
	if _, _, err := parse("--publish", "8080").options("e2b"); !errors.As(err, &ie) {
		t.Errorf("--publish on e2b = %v, want Invalid", err)
	}
	if n, ports, err := parse().options("e2b"); err != nil || n != "" || ports != nil {
		t.Errorf("no flags on e2b = %q %v %v", n, ports, err)
	}
	// Through the platform, serve proxies published ports (or refuses them).
	for _, p := range []string{"platform", "platform:local"} {
		if _, ports, err := parse("--publish", "8080").options(p); err != nil || len(ports) != 1 || ports[0] != 8080 {
			t.Errorf("--publish on %s = %v %v", p, ports, err)
		}
		if _, _, err := parse("--network", "none").options(p); !errors.As(err, &ie) {
			t.Errorf("--network on %s = %v, want Invalid", p, err)
		}
	}
}
