package hostfacts_test

import (
	"context"
	"runtime"
	"syscall"
	"testing"

	"github.com/managoat/managoat/mechanism/hostfacts"
)

func TestAllNamesEveryFactWithEvidence(t *testing.T) {
	all := hostfacts.All()
	if len(all) != len(hostfacts.Names()) {
		t.Fatalf("All gave %d facts for %d names", len(all), len(hostfacts.Names()))
	}
	for i, f := range all {
		if f.Name != hostfacts.Names()[i] || f.Detail == "" || f.Affects == "" {
			t.Errorf("fact %d: %+v: want %s with a detail and what it affects", i, f, hostfacts.Names()[i])
		}
		t.Logf("%-16s %-5v %s", f.Name, f.Present, f.Detail)
	}
}

// TestIA32AgreesWithACall checks the probe against an i386 call made
// here: getpid runs and answers the child's pid where the fact is present,
// and ends the child by a signal where it is absent (run the package under
// internal/ia32off to see the second).
func TestIA32AgreesWithACall(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if hostfacts.Has(hostfacts.IA32) {
			t.Fatal("IA32 present off x86-64")
		}
		return
	}
	o := hostfacts.TryI386(context.Background(), 20, [3]uint32{}, nil)
	if o.Err != nil {
		t.Fatal(o.Err)
	}
	if hostfacts.Has(hostfacts.IA32) {
		if !o.Ran || o.Result <= 1 {
			t.Fatalf("IA32 present but getpid: %+v", o)
		}
	} else if o.Ran || (o.Signal != syscall.SIGSEGV && o.Signal != syscall.SIGSYS) {
		t.Fatalf("IA32 absent but getpid: %+v", o)
	}
	// An unknown number is ENOSYS from the kernel, not a crash.
	if o := hostfacts.TryI386(context.Background(), 1000, [3]uint32{}, nil); hostfacts.Has(hostfacts.IA32) && (!o.Ran || o.Result != -int32(syscall.ENOSYS)) {
		t.Fatalf("i386 call 1000: %+v, want ENOSYS", o)
	}
}

func TestUnknownFact(t *testing.T) {
	if f := hostfacts.Get("warp_drive"); f.Present || f.Detail == "" {
		t.Fatalf("%+v", f)
	}
}
