package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/store/sqlite"
)

// TestEnrollLabels: enroll --label records the runner's operator labels
// in the platform's records (its runner schedule, under the account's
// id); a malformed label is a usage error that enrols nothing.
func TestEnrollLabels(t *testing.T) {
	dir := t.TempDir()
	runners, db := filepath.Join(dir, "runners.json"), filepath.Join(dir, "platform.db")
	if _, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "--db", db, "--label", "Zone=eu", "bad"); code != 2 || !strings.Contains(e, "label key") {
		t.Errorf("enroll --label Zone=eu: exit %d stderr %q, want 2 naming the label key", code, e)
	}
	if _, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "--db", db, "--label", "zone", "bad"); code != 2 || !strings.Contains(e, "not key=value") {
		t.Errorf("enroll --label zone: exit %d stderr %q, want 2", code, e)
	}
	out, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "--db", db, "--account", "alice", "--label", "gpu=h100", "--label", "zone=eu", "gpu1")
	if code != 0 || !strings.HasPrefix(out, "mgr_") {
		t.Fatalf("enroll --label: exit %d stdout %q stderr %q", code, out, e)
	}
	st, err := sqlite.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	scheds, err := st.RunnerSchedules(context.Background(), "alice") // no account record: its name, as the relay maps it
	if err != nil || len(scheds) != 1 || scheds[0].Name != "gpu1" || fmt.Sprint(scheds[0].Labels) != "map[gpu:h100 zone:eu]" {
		t.Fatalf("schedules %+v, %v; want gpu1's labels gpu=h100 zone=eu", scheds, err)
	}
	r, err := st.RunnerByName(context.Background(), "alice", "gpu1")
	if err != nil || r.ID != scheds[0].RunnerID || !r.Enrolled {
		t.Errorf("runner record %+v, %v; want the schedule's id, enrolled", r, err)
	}
	if _, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "--db", db, "bad"); code != 0 {
		t.Errorf("enroll without labels after a refused one: exit %d %s (the refused one enrolled it?)", code, e)
	}
}
