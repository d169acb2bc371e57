package daytonatest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSoftDeletePhases pins the API's soft delete (sandbox.service.ts
// destroy, sandbox.entity.ts getSoftDeleteUpdate): renamed
// DESTROYED_<name>_<ms> with desiredState destroyed at once, listed first
// in its former state, then "destroying", then gone from the list; while
// it is pending, another delete or a start is a 409.
func TestSoftDeletePhases(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.DestroyPending, s.DestroyDelay = time.Hour, time.Hour
	if st, b := s.do(t, "POST", s.URL+"/sandbox", `{"name":"doomed","labels":{"k":"v"}}`, nil); st != 200 {
		t.Fatalf("create: %d %s", st, b)
	}
	if st, b := s.do(t, "DELETE", s.URL+"/sandbox/doomed", "", nil); st != 200 {
		t.Fatalf("delete: %d %s", st, b)
	}
	if st, _ := s.do(t, "GET", s.URL+"/sandbox/doomed", "", nil); st != 404 {
		t.Fatalf("GET by the old name: %d, want 404", st)
	}
	list := func() (name, state, desired string) {
		t.Helper()
		_, b := s.do(t, "GET", s.URL+`/sandbox?labels={"k":"v"}`, "", nil)
		var page struct {
			Items []struct{ Name, State, DesiredState string }
		}
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("list %s: %v", b, err)
		}
		switch len(page.Items) {
		case 0:
			return "", "", ""
		case 1:
			it := page.Items[0]
			return it.Name, it.State, it.DesiredState
		}
		t.Fatalf("list %s", b)
		return
	}
	name, state, desired := list()
	if !strings.HasPrefix(name, "DESTROYED_doomed_") || state != "started" || desired != "destroyed" {
		t.Fatalf("pending: listed %q %q desired %q", name, state, desired)
	}
	for _, rq := range [][2]string{{"DELETE", "/sandbox/" + name}, {"POST", "/sandbox/" + name + "/start"}} {
		if st, b := s.do(t, rq[0], s.URL+rq[1], "", nil); st != 409 {
			t.Fatalf("%s %s while pending: %d %s, want 409", rq[0], rq[1], st, b)
		}
	}
	s.DestroyPending = 0
	if n, state, desired := list(); n != name || state != "destroying" || desired != "destroyed" {
		t.Fatalf("destroying: listed %q %q desired %q", n, state, desired)
	}
	s.DestroyDelay = 0
	if n, _, _ := list(); n != "" {
		t.Fatalf("destroyed, still listed: %q", n)
	}
}

// TestExecuteModes pins /process/execute: v0.190.0 pipes the command into
// a shell (pipes and variables work), older daemons split it on spaces
// and run it without one (they do not).
func TestExecuteModes(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, b := s.do(t, "POST", s.URL+"/sandbox", `{"name":"x"}`, nil); st != 200 {
		t.Fatalf("create: %d %s", st, b)
	}
	sb, _ := s.Lookup("x")
	run := func() string {
		t.Helper()
		st, b := s.do(t, "POST", s.proxyURL(sb.Target)+sb.ID+"/process/execute", `{"command":"echo a | tr a b"}`, nil)
		if st != 200 {
			t.Fatalf("execute: %d %s", st, b)
		}
		var r struct{ Result string }
		_ = json.Unmarshal(b, &r)
		return r.Result
	}
	if got := run(); got != "b\n" {
		t.Fatalf("shell execute: %q", got)
	}
	s.SplitExecute = true
	if got := run(); got != "a | tr a b\n" {
		t.Fatalf("split execute: %q", got)
	}
}
