package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/local/journal"
)

// TestSessionJournalCapped is issue 24's unattached `yes`: a session
// writing without end keeps only its latest output on disk (the
// sandbox's MaxSessionBytes), and a follower from byte zero is told how
// much older output was dropped before it gets the rest, in order.
func TestSessionJournalCapped(t *testing.T) {
	c := newSandbox(t)
	const limit = 2 << 20
	if err := WriteRetention(c.Dir, journal.Retention{MaxSessionBytes: limit}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "yes | head -c 33554432; echo end"}})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the end, unattached, then look at the disk.
	deadline := time.Now().Add(30 * time.Second)
	for {
		state, _ := SessionState(c.Dir, id)
		if state == "exited" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session did not end: %s", state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(JournalPath(c.Dir, id), &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > limit+1<<20 {
		t.Fatalf("the journal uses %d bytes of disk, its cap is %d", used, limit)
	}
	var col collected
	o, err := c.Follow(ctx, id, col.emit)
	if err != nil || !o.Exited || o.Code != 0 {
		t.Fatalf("outcome %+v, %v", o, err)
	}
	if !strings.Contains(col.err.String(), "bytes of older output were dropped") {
		t.Fatalf("no word of the dropped output; stderr %q", col.err.String())
	}
	out := col.out.String()
	if !strings.HasSuffix(out, "y\nend\n") || len(out) > limit || len(out) < limit/4 {
		t.Fatalf("followed %d bytes ending %q", len(out), out[max(0, len(out)-10):])
	}
	if strings.Trim(strings.TrimSuffix(out, "end\n"), "y\n") != "" {
		t.Fatal("the kept output holds bytes yes never wrote")
	}
}

// TestSlowFollowerLosesNothingToTheCap (issue 31, 1): a follower slower
// than the command (it stalls 300 ms at the start, then reads slowly)
// gets every byte of a session that writes 16 times its journal's cap,
// in order, and no word of dropped output: while it is behind, the
// command waits instead of the cap dropping what it has not read. (A
// 500 MiB exec through managoat, read as fast as a pipe takes it, lost
// 40 MB to the default 256 MiB cap.) Once it left, the cap applies again.
func TestSlowFollowerLosesNothingToTheCap(t *testing.T) {
	c := newSandbox(t)
	const limit = 2 << 20
	if err := WriteRetention(c.Dir, journal.Retention{MaxSessionBytes: limit}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const total = 16 * limit
	// The command waits for the follower to be there (its first record
	// read): output written before any reader is capped, as it should be,
	// and a loaded machine could run the whole command before Follow.
	gate := filepath.Join(t.TempDir(), "go")
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c",
		"echo ready; while [ ! -e " + gate + " ]; do sleep 0.01; done; seq 1 10000000 | head -c " + strconv.Itoa(total)}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	first := true
	o, err := c.Follow(ctx, id, func(r journal.Record) bool {
		if first {
			first = false
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Error(err)
			}
			time.Sleep(300 * time.Millisecond) // busy: the command runs on
			return true                        // the ready line
		}
		if col.n%8 == 0 {
			time.Sleep(time.Millisecond) // and slow
		}
		return col.emit(r)
	})
	if err != nil || !o.Exited || o.Code != 0 {
		t.Fatalf("outcome %+v, %v", o, err)
	}
	if col.err.Len() != 0 {
		t.Fatalf("stderr %q", col.err.String())
	}
	var want strings.Builder
	for i := 1; want.Len() < total; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if got := col.out.String(); got != want.String()[:total] {
		t.Fatalf("followed %d bytes of %d, not the command's output in order", len(got), total)
	}
}
