package supervisor

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/local/journal"
)

// BenchmarkPump: the supervisor's pipe-to-journal path alone (no
// follower), splice and copy, against a plain pipe read in the same run.
func BenchmarkPump(b *testing.B) {
	const size = 256 << 20
	run := func(b *testing.B, f func(r *os.File) int64) time.Duration {
		r, w, _ := os.Pipe()
		_, _ = unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, 1<<20)
		cmd := exec.Command("head", "-c", strconv.Itoa(size), "/dev/zero")
		cmd.Stdout = w
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		w.Close()
		n := f(r)
		cmd.Wait()
		r.Close()
		if n != size {
			b.Fatalf("moved %d", n)
		}
		return time.Since(start)
	}
	pipe := func(r *os.File) int64 { n, _ := io.Copy(io.Discard, r); return n }
	toJournal := func(splice bool) func(r *os.File) int64 {
		return func(r *os.File) int64 {
			jw, err := journal.Create(filepath.Join(b.TempDir(), "j"))
			if err != nil {
				b.Fatal(err)
			}
			sess := &session{w: jw, changed: make(chan struct{})}
			if splice {
				pump(sess, r, journal.KindStdout, 1<<20)
			} else {
				pumpCopy(sess, r, journal.KindStdout, 1<<20)
			}
			jw.Close()
			var n int64
			rd, _ := journal.Open(filepath.Join(filepath.Dir(jw.Name()), "j"))
			rd.Read(-1, func(rec journal.Record) error { n += int64(len(rec.Data)); return nil })
			rd.Close()
			return n
		}
	}
	var tp, ts, tc time.Duration
	for i := 0; i < b.N; i++ {
		tp += run(b, pipe)
		ts += run(b, toJournal(true))
		tc += run(b, toJournal(false))
	}
	mb := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mb(tp), "pipe-MB/s")
	b.ReportMetric(mb(ts), "splice-MB/s")
	b.ReportMetric(mb(tc), "copy-MB/s")
	b.ReportMetric(mb(ts)/mb(tp), "ratio")
}

// BenchmarkSessionEndSync: what the sync at a session's end (journal's
// package doc, Durability) costs a 256 MiB session: the pipe-to-journal
// pump with and without the Sync after it, in the same run.
func BenchmarkSessionEndSync(b *testing.B) {
	const size = 256 << 20
	session := func(b *testing.B, sync bool) time.Duration {
		r, w, _ := os.Pipe()
		_, _ = unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, 1<<20)
		cmd := exec.Command("head", "-c", strconv.Itoa(size), "/dev/urandom")
		cmd.Stdout = w
		jw, err := journal.Create(filepath.Join(b.TempDir(), "j"))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		w.Close()
		pump(&session{w: jw, changed: make(chan struct{})}, r, journal.KindStdout, 1<<20)
		cmd.Wait()
		r.Close()
		if _, err := jw.AppendExit(0, 0); err != nil {
			b.Fatal(err)
		}
		if sync {
			if err := jw.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		d := time.Since(start)
		jw.Close()
		return d
	}
	var plain, synced time.Duration
	for i := 0; i < b.N; i++ {
		plain += session(b, false)
		synced += session(b, true)
	}
	b.ReportMetric(float64(plain.Milliseconds())/float64(b.N), "nosync-ms")
	b.ReportMetric(float64(synced.Milliseconds())/float64(b.N), "sync-ms")
	b.ReportMetric(plain.Seconds()/synced.Seconds(), "ratio")
}
