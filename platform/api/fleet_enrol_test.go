package api_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
)

// TestEnrolLabels: labels given at enrolment (managoat enroll --label)
// are the runner's operator labels: recorded before its first connection,
// shown by GET /v1/runners, over the daemon's own label of the same key,
// and honoured by runner_selector placement. Malformed labels are
// invalid and record nothing.
func TestEnrolLabels(t *testing.T) {
	runners := filepath.Join(t.TempDir(), "runners.json")
	pl := apitest.Start(t, apitest.Options{RunnerAuth: func(a *api.RunnerAuth) { a.Fallback = runnerprov.RunnerFile{Path: runners} }})
	key := pl.Account(t, "alice")
	ctx := context.Background()
	secrets := map[string]string{}
	for _, n := range []string{"big", "small"} {
		s, err := runnerprov.Enroll(runners, n, "alice", false)
		if err != nil {
			t.Fatal(err)
		}
		secrets[n] = s
	}
	for _, bad := range []map[string]string{{"Zone": "eu"}, {"zone": strings.Repeat("x", 64)}, {"": "x"}} {
		err := api.EnrolLabels(ctx, pl.Store, "alice", "big", bad)
		var inv *sandbox.InvalidError
		if !errors.As(err, &inv) || inv.Reason != "labels" {
			t.Errorf("EnrolLabels(%v) = %v, want invalid{labels}", bad, err)
		}
	}
	if s, err := pl.Store.RunnerSchedules(ctx, mustAcct(t, pl, "alice")); err != nil || len(s) != 0 {
		t.Fatalf("after malformed labels: schedules %v, %v; want none", s, err)
	}
	// Before either daemon connected: big is the GPU host, in zone eu.
	if err := api.EnrolLabels(ctx, pl.Store, "alice", "big", map[string]string{"gpu": "h100", "zone": "eu"}); err != nil {
		t.Fatal(err)
	}
	// Again: the named keys change, the others stay; "k=" removes one.
	if err := api.EnrolLabels(ctx, pl.Store, "alice", "big", map[string]string{"zone": "", "pool": "a"}); err != nil {
		t.Fatal(err)
	}
	// The daemons' own labels: big says gpu=none (the operator's h100 wins).
	fleetRunner(t, pl.URL, secrets["big"], "big", 4*gibi, map[string]string{"gpu": "none", "rack": "r1"})
	fleetRunner(t, pl.URL, secrets["small"], "small", 8*gibi, nil)
	waitCapacity(t, pl, 2)
	vs := runnerViews(t, pl, key)
	if got := fmt.Sprint(vs["big"].OperatorLabels); got != "map[gpu:h100 pool:a]" {
		t.Errorf("big's operator labels %s, want map[gpu:h100 pool:a]", got)
	}
	if got := fmt.Sprint(vs["big"].Labels); got != "map[gpu:none rack:r1]" {
		t.Errorf("big's own labels %s, want the daemon's map[gpu:none rack:r1]", got)
	}
	create := func(name, sel string) answer {
		return call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+name+`", "provider": "runner", "runner_selector": "`+sel+`"}`))
	}
	for i := range 3 {
		name := fmt.Sprintf("g%d", i)
		if a := create(name, "gpu=h100"); a.status != 201 || runnerOf(t, pl, key, name) != "big" {
			t.Fatalf("gpu=h100: %d %s on %s, want big", a.status, a.body, runnerOf(t, pl, key, name))
		}
	}
	if a := create("n", "gpu=none"); a.status != 403 || a.err == nil || a.err.Reason != "no_runner_fits" {
		t.Errorf("gpu=none (the daemon's value, under the operator's) = %d %s, want 403 no_runner_fits", a.status, a.body)
	}
	if a := create("r", "rack=r1,pool=a"); a.status != 201 || runnerOf(t, pl, key, "r") != "big" {
		t.Errorf("rack=r1,pool=a (the daemon's and the operator's keys) = %d %s", a.status, a.body)
	}
	if a := create("z", "zone=eu"); a.status != 403 {
		t.Errorf("zone=eu (removed at the second enrolment) = %d %s, want 403", a.status, a.body)
	}
}
