package api_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/sandbox"
)

// TestSandboxQuota: an account holds at most MaxSandboxesPerAccount
// sandboxes: one more create is 403 denied{resource_exhausted} with a
// message naming the bound (the Go client's error is a DeniedError of that
// reason), adopting a name it holds is not one more, another account is
// not affected, a destroy makes room, and concurrent creates never pass
// the bound. Fails with no bound: the third create is 201.
func TestSandboxQuota(t *testing.T) {
	pl := withFake(t, apitest.Options{Configure: func(c *api.Config) { c.MaxSandboxesPerAccount = 2 }})
	alice, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	create := func(key, name string) answer {
		return call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name":"`+name+`","provider":"fake"}`))
	}
	for _, n := range []string{"a", "b"} {
		if a := create(alice, n); a.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", n, a.status, a.body)
		}
	}
	a := create(alice, "c")
	if a.status != http.StatusForbidden || a.err == nil || a.err.Kind != "denied" || a.err.Reason != "resource_exhausted" ||
		!strings.Contains(a.err.Message, "2 sandboxes") {
		t.Fatalf("a third sandbox: %d %s, want 403 denied{resource_exhausted} naming the bound", a.status, a.body)
	}
	var dn *sandbox.DeniedError
	if err := a.err.Err(); !errors.As(err, &dn) || !strings.HasPrefix(dn.Reason, "resource_exhausted") {
		t.Fatalf("the client's error: %v, want DeniedError{resource_exhausted}", err)
	}
	if a := create(alice, "a"); a.status != http.StatusOK {
		t.Fatalf("adopting a name alice holds: %d %s", a.status, a.body)
	}
	if a := create(bob, "c"); a.status != http.StatusCreated {
		t.Fatalf("bob's first: %d %s", a.status, a.body)
	}
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/b", alice, nil); a.status/100 != 2 {
		t.Fatalf("destroy b: %d %s", a.status, a.body)
	}
	if a := create(alice, "c"); a.status != http.StatusCreated {
		t.Fatalf("create after a destroy: %d %s", a.status, a.body)
	}

	carol := pl.Account(t, "carol")
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Go(func() { statuses[i] = create(carol, fmt.Sprintf("x%d", i)).status })
	}
	wg.Wait()
	made := 0
	for _, st := range statuses {
		switch st {
		case http.StatusCreated:
			made++
		case http.StatusForbidden:
		default:
			t.Fatalf("concurrent creates: %v", statuses)
		}
	}
	if made != 2 {
		t.Fatalf("%d of 8 concurrent creates made a sandbox with a bound of 2 (%v)", made, statuses)
	}
}
