package journal_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/local/journal"
)

// allocated is the disk space the file at path holds.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func cappedWriter(t *testing.T, path string, n int64) *journal.Writer {
	t.Helper()
	w, err := journal.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.SetCap(n); err != nil {
		// ext4, xfs, btrfs and tmpfs punch holes; a test directory on a
		// filesystem that cannot is a missing prerequisite.
		testenv.Require(t, !errors.Is(err, journal.ErrCapUnsupported), "a TMPDIR whose filesystem can punch holes: "+err.Error())
		t.Fatal(err)
	}
	return w
}

// record i's data: 4 KiB naming i, so a reader can tell which it got.
func capRecord(i int) []byte {
	b := bytes.Repeat([]byte{'.'}, 4096)
	copy(b, fmt.Sprintf("record %08d|", i))
	return b
}

// TestCapDropsOldestRecords: a writer that goes on past its cap keeps
// about the cap on disk; a reader from byte zero jumps to the first record
// kept, says how much it skipped, and reads every record after it whole
// and in order, up to the last one written.
func TestCapDropsOldestRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	const limit = 4 << 20
	w := cappedWriter(t, path, limit)
	const n = 4000 // 16 MiB written
	for i := 0; i < n; i++ {
		if _, err := w.Append(journal.KindStdout, capRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.AppendExit(0, 0); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, path); a > limit+2<<20 {
		t.Fatalf("the journal holds %d bytes on disk, its cap is %d", a, limit)
	}
	if w.Head() == 0 {
		t.Fatal("nothing was dropped")
	}
	r, err := journal.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first, next, exited := -1, -1, false
	_, err = r.Read(-1, func(rec journal.Record) error {
		if rec.Kind == journal.KindExit {
			exited = true
			return nil
		}
		var i int
		if _, err := fmt.Sscanf(string(rec.Data[:16]), "record %08d|", &i); err != nil {
			return fmt.Errorf("record at %d: %q", rec.Offset, rec.Data[:20])
		}
		if first < 0 {
			first = i
		} else if i != next {
			return fmt.Errorf("record %d after %d", i, next-1)
		}
		next = i + 1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !exited || next != n {
		t.Fatalf("read to record %d (exit %v), want %d and the exit", next, exited, n)
	}
	if r.Skipped() != w.Head() || int64(first)*(4096+journal.HeaderSize) != w.Head() {
		t.Fatalf("skipped %d, head %d, first record %d", r.Skipped(), w.Head(), first)
	}

	// After a restart the writer keeps its head and goes on dropping.
	w.Close()
	w2, err := journal.OpenAppend(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if w2.Head() != w.Head() {
		t.Fatalf("reopened head %d, was %d", w2.Head(), w.Head())
	}
}

// TestCapSlowReaderNeverReadsZeros: a reader that lags while the writer
// drops what it has not read yet jumps ahead; it never delivers a hole's
// zeros or reports the journal corrupt.
func TestCapSlowReaderNeverReadsZeros(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	w := cappedWriter(t, path, 1<<20)
	const n = 6000
	r, err := journal.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			if _, err := w.Append(journal.KindStdout, capRecord(i)); err != nil {
				t.Error(err)
				return
			}
		}
		_, _ = w.AppendExit(0, 0)
	}()
	last, done := -1, false
	for !done {
		_, err := r.Read(w.Size(), func(rec journal.Record) error {
			if rec.Kind == journal.KindExit {
				done = true
				return nil
			}
			var i int
			if _, err := fmt.Sscanf(string(rec.Data[:16]), "record %08d|", &i); err != nil || !bytes.Equal(rec.Data, capRecord(i)) {
				return fmt.Errorf("a record that was never written at %d: %q", rec.Offset, rec.Data[:20])
			}
			if i <= last {
				return fmt.Errorf("record %d after %d", i, last)
			}
			last = i
			time.Sleep(50 * time.Microsecond) // a slow reader
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if last != n-1 {
		t.Fatalf("last record %d, want %d", last, n-1)
	}
	if r.Skipped() == 0 {
		t.Fatal("the reader never fell behind the cap: the test proved nothing")
	}
}

// TestCapKeepsTheFloor: the cap drops nothing from the floor on (a
// reader's position, SetFloor): past the cap the records are kept until
// the floor moves, and then dropped as before; a reader from the floor
// gets every byte after it.
func TestCapKeepsTheFloor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	const limit = 4 << 20
	w := cappedWriter(t, path, limit)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for w.Size() < 2<<20 {
		if _, err := w.Append(journal.KindStdout, chunk); err != nil {
			t.Fatal(err)
		}
	}
	floor := w.Size()
	w.SetFloor(floor)
	for w.Size() < floor+3*limit {
		if _, err := w.Append(journal.KindStdout, chunk); err != nil {
			t.Fatal(err)
		}
	}
	if h := w.Head(); h > floor {
		t.Fatalf("head %d past the floor %d", h, floor)
	}
	w.SetFloor(-1)
	if _, err := w.Append(journal.KindStdout, chunk); err != nil {
		t.Fatal(err)
	}
	if h := w.Head(); h <= floor {
		t.Fatalf("head %d: nothing dropped once the floor went (floor was %d)", h, floor)
	}
}
