package jail

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// claimRange never gives a range that meets a subordinate range of
// /etc/subuid or /etc/subgid or an id of /etc/passwd or /etc/group,
// never one another live sandbox holds, and takes over the claim of a
// sandbox that is gone.
func TestClaimRangeAvoidsTheHostsIDs(t *testing.T) {
	dir := t.TempDir()
	j := &Jail{cfg: Config{IDMapDir: filepath.Join(dir, "idmap"), StateDir: dir}}
	owner := filepath.Join(dir, "sb")
	for i := 0; rangeStart(owner)+5 > idRangeCount; i++ { // no wrap-around in the test's five
		owner = filepath.Join(dir, "sb"+strconv.Itoa(i))
	}
	if err := os.Mkdir(owner, 0o700); err != nil {
		t.Fatal(err)
	}
	first := idRangeFirst + rangeStart(owner)*idRangeSize
	// The owner's first candidate is delegated in subuid, the next one's
	// last id is a group's, the one after a subgid range's middle.
	files := map[string]string{
		"subuid": fmt.Sprintf("alice:%d:65536\n", first),
		"subgid": fmt.Sprintf("# comment\nbob:%d:10\n", first+2*idRangeSize+30000),
		"passwd": "root:x:0:0::/root:/bin/sh\n",
		"group":  fmt.Sprintf("odd:x:%d:\n", first+2*idRangeSize-1),
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := idFiles
	idFiles.subuid, idFiles.subgid = filepath.Join(dir, "subuid"), filepath.Join(dir, "subgid")
	idFiles.passwd, idFiles.group = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	t.Cleanup(func() { idFiles = old })
	ctx := context.Background()
	// A live sandbox holds the fourth candidate.
	live := filepath.Join(dir, "live")
	os.Mkdir(live, 0o700)
	if err := writeState(live, &state{Mechanism: "jail", ID: "live", IDBase: first + 3*idRangeSize}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(j.cfg.IDMapDir, 0o700)
	os.WriteFile(filepath.Join(j.cfg.IDMapDir, strconv.Itoa(first+3*idRangeSize)), []byte(live), 0o600)
	// A gone sandbox held the fifth.
	os.WriteFile(filepath.Join(j.cfg.IDMapDir, strconv.Itoa(first+4*idRangeSize)), []byte(filepath.Join(dir, "gone")), 0o600)
	base, err := j.claimRange(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	if want := first + 4*idRangeSize; base != want {
		t.Fatalf("claimed %d (candidate %d), want %d (candidate 4: 0 subuid, 1 a group id, 2 subgid, 3 live)", base, (base-first)/idRangeSize, want)
	}
	if b, _ := os.ReadFile(filepath.Join(j.cfg.IDMapDir, strconv.Itoa(base))); string(b) != owner {
		t.Fatalf("claim names %q", b)
	}
	// Claimed and provisioned (its state records it), the range is not
	// given again; released, it is.
	if err := writeState(owner, &state{Mechanism: "jail", ID: "sb", IDBase: base}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "sb2")
	os.Mkdir(other, 0o700)
	if b2, err := j.claimRange(ctx, other); err != nil || b2 == base {
		t.Fatalf("second claim %d, %v; the first holds %d", b2, err, base)
	}
	j.releaseRange(ctx, owner, base)
	if _, err := os.Stat(filepath.Join(j.cfg.IDMapDir, strconv.Itoa(base))); !os.IsNotExist(err) {
		t.Fatalf("released claim: %v", err)
	}
}

// The registry sweep removes the claims of sandboxes that are gone and
// keeps the others.
func TestSweepRangesRemovesGoneClaims(t *testing.T) {
	reg := t.TempDir()
	dir := t.TempDir()
	live := filepath.Join(dir, "live")
	os.Mkdir(live, 0o700)
	if err := writeState(live, &state{Mechanism: "jail", ID: "live", IDBase: idRangeFirst}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(reg, strconv.Itoa(idRangeFirst)), []byte(live), 0o600)
	os.WriteFile(filepath.Join(reg, strconv.Itoa(idRangeFirst+idRangeSize)), []byte(filepath.Join(dir, "gone")), 0o600)
	lastRangeSweep.Store(0)
	sweepRanges(reg)
	if _, err := os.Stat(filepath.Join(reg, strconv.Itoa(idRangeFirst))); err != nil {
		t.Errorf("the live claim: %v", err)
	}
	if _, err := os.Stat(filepath.Join(reg, strconv.Itoa(idRangeFirst+idRangeSize))); !os.IsNotExist(err) {
		t.Errorf("the gone sandbox's claim: %v", err)
	}
}

// The sweep's period holds across processes: a new process (its own
// lastRangeSweep zero) within the period leaves the registry as it is,
// and sweeps again once the registry's mark is older than the period.
// Without the mark, each CLI command, a process of its own, read every
// claim and its sandbox's state.
func TestSweepRangesOncePerPeriodAcrossProcesses(t *testing.T) {
	reg, dir := t.TempDir(), t.TempDir()
	claim := func(i int) string {
		p := filepath.Join(reg, strconv.Itoa(idRangeFirst+i*idRangeSize))
		os.WriteFile(p, []byte(filepath.Join(dir, "gone"+strconv.Itoa(i))), 0o600)
		return p
	}
	lastRangeSweep.Store(0)
	first := claim(0)
	sweepRanges(reg)
	if _, err := os.Stat(first); !os.IsNotExist(err) {
		t.Fatalf("the first sweep left the gone sandbox's claim: %v", err)
	}
	second := claim(1)
	lastRangeSweep.Store(0) // another process
	sweepRanges(reg)
	if _, err := os.Stat(second); err != nil {
		t.Fatalf("a sweep within the period ran again (removed the claim: %v)", err)
	}
	old := time.Now().Add(-rangeSweepEvery - time.Minute)
	if err := os.Chtimes(filepath.Join(reg, sweptName), old, old); err != nil {
		t.Fatal(err)
	}
	lastRangeSweep.Store(0)
	sweepRanges(reg)
	if _, err := os.Stat(second); !os.IsNotExist(err) {
		t.Fatalf("the sweep after the period left the gone sandbox's claim: %v", err)
	}
}
