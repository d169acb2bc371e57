package supervisor

// A session's output pumps: each of a session's pipes is moved into its
// journal (splice(2) through a staging pipe, or read and write), and run
// waits for the process, drains its pipes and appends the exit record.
// The RPC server that starts sessions is server.go.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/local/journal"
)

// LossMessage is the line a session's stderr gets where n bytes of its
// output could not be journaled (n < 0: an unknown number).
func LossMessage(n int) string {
	if n < 0 {
		return "\n[managoat: some of this session's output was lost: the journal's file system was full]\n"
	}
	return fmt.Sprintf("\n[managoat: %d bytes of this session's output were lost: the journal's file system was full]\n", n)
}

// lostOutput logs, once per loss, that the journal refused output.
func (s *session) lostOutput(k journal.Kind, err error) {
	if s.losing.CompareAndSwap(false, true) && s.log != nil {
		s.log.Warn("session output is being dropped: the journal refuses it", "id", s.id, "stream", k, "err", err)
	}
}

// recovered logs that the journal takes output again.
func (s *session) recovered(k journal.Kind, lost int) {
	s.losing.Store(false)
	if s.log != nil {
		s.log.Warn("session output is journaled again", "id", s.id, "stream", k, "lost_bytes", lost)
	}
}

// pump moves one pipe's data into the journal with splice(2), with no
// copy through this process: a record per batch of the bytes the pipe
// holds when the pump wakes (at most max), and one notification of the
// followers per record. No timer delays a record: a lone small write is
// journaled as soon as the pump sees it.
//
// A batch goes through a private staging pipe: splice(2) first moves the
// batch's pipe buffers from the command's pipe to the staging pipe (no
// copy, the command's pipe is locked only for that), then from the staging
// pipe into the journal. A splice straight into the file would hold the
// command's pipe locked while the kernel copies the whole batch into the
// page cache, so the command could not write meanwhile: writer and pump
// would take turns instead of running at once. The bytes in the staging
// pipe are in the kernel, as they were in the command's pipe; none is
// held in this process's memory. When splice is refused the pump falls
// back to read and write (pumpCopy).
func pump(sess *session, f *os.File, k journal.Kind, max int) {
	rc, err := f.SyscallConn()
	if st, serr := f.Stat(); err != nil || serr != nil || st.Mode()&os.ModeNamedPipe == 0 {
		pumpCopy(sess, f, k, max) // splice needs a pipe (a pty is not one)
		return
	}
	stage := &stagePipe{r: -1, w: -1}
	defer stage.close()
	fallback := false
	lost := 0
	for !fallback {
		sess.holdForReaders()
		eof := false
		var serr error
		err := rc.Read(func(fd uintptr) bool {
			avail, e := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
			if e != nil {
				serr = e
				return true
			}
			if avail == 0 {
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				if n, _ := unix.Poll(pfd, 0); n > 0 && pfd[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
					eof = true
					return true
				}
				return false // wait until readable
			}
			if avail > max {
				avail = max
			}
			src := int(fd)
			if stage.open(max) {
				n, e := unix.Splice(src, nil, stage.w, nil, avail, unix.SPLICE_F_NONBLOCK)
				switch {
				case e == nil && n > 0:
					src, avail = stage.r, int(n)
				case e == unix.EINTR || e == unix.EAGAIN:
					return true // try again
				default:
					stage.close() // splice straight into the journal
				}
			}
			if _, e := sess.w.AppendSplice(k, src, avail); e != nil {
				if errors.Is(e, unix.EINVAL) || errors.Is(e, unix.ENOSYS) {
					// The journal's file system refuses splice: what
					// the staging pipe holds goes by read and write.
					fallback = true
					if src == stage.r {
						serr = stage.copyOut(sess, k, avail)
					}
					return true
				}
				// The journal cannot take it (a full disk): what the
				// splice did not move is read and dropped, and the pump
				// goes on reading so the command never blocks on its
				// pipe (pumpCopy counts the loss and says it).
				lost = -1 // some: the bytes a direct splice took are unknown
				if src == stage.r {
					stage.discard()
					lost = avail // all of the batch: torn off the journal, or dropped
				}
				sess.lostOutput(k, e)
				fallback = true
				return true
			}
			sess.notify()
			return true
		})
		if err != nil || serr != nil || eof {
			return
		}
	}
	pumpCopyLosing(sess, f, k, max, lost)
}

// discard reads and drops what the staging pipe still holds (a failed
// splice into the journal took part of its batch).
func (p *stagePipe) discard() {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.IoctlGetInt(p.r, unix.TIOCINQ) // FIONREAD
		if err != nil || n <= 0 {
			return
		}
		m, err := unix.Read(p.r, buf[:min(len(buf), n)])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			return
		}
	}
}

// stagePipe is pump's staging pipe, opened at the first batch, so an idle
// stream costs no descriptors. It is empty between batches.
type stagePipe struct {
	r, w   int
	failed bool
}

// open opens the pipe unless it is open; it reports whether it is.
func (p *stagePipe) open(size int) bool {
	if p.r >= 0 || p.failed {
		return !p.failed
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		p.failed = true
		return false
	}
	p.r, p.w = fds[0], fds[1]
	// A smaller pipe (the per-user limit on pipe memory) only makes
	// batches smaller: a splice moves what fits.
	_, _ = unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, size)
	return true
}

// copyOut appends the n bytes the pipe holds to the journal with read and
// write.
func (p *stagePipe) copyOut(sess *session, k journal.Kind, n int) error {
	buf := make([]byte, journal.HeaderSize+n)
	for got := 0; got < n; {
		m, err := unix.Read(p.r, buf[journal.HeaderSize+got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			return fmt.Errorf("supervisor: staging pipe: %v", err)
		}
		got += m
	}
	if _, err := sess.w.AppendFramed(k, buf); err != nil {
		return err
	}
	sess.notify()
	return nil
}

func (p *stagePipe) close() {
	if p.r >= 0 {
		unix.Close(p.r)
		unix.Close(p.w)
	}
	p.r, p.w, p.failed = -1, -1, true
}

// pumpCopy copies one pipe into the journal with read and write. Its
// buffer starts small and grows while reads fill it, so an idle session
// costs little memory and a busy one moves large records.
func pumpCopy(sess *session, f *os.File, k journal.Kind, max int) { pumpCopyLosing(sess, f, k, max, 0) }

// pumpCopyLosing is pumpCopy when lost bytes of this stream were already
// dropped. Output the journal cannot take (a full disk) is read and
// dropped, never left in the pipe (where the command would block writing
// for good, even after space came back): the pump counts it, and when
// the journal takes a record again, it first appends a line to the
// session's stderr saying how many bytes were lost, and logs both moments
// in the supervisor's log.
func pumpCopyLosing(sess *session, f *os.File, k journal.Kind, max, lost int) {
	size := 64 << 10
	buf := make([]byte, journal.HeaderSize+size)
	for {
		sess.holdForReaders()
		n, err := f.Read(buf[journal.HeaderSize:])
		if n > 0 {
			if lost != 0 {
				if _, werr := sess.w.Append(journal.KindStderr, []byte(LossMessage(lost))); werr == nil {
					sess.recovered(k, lost)
					lost = 0
				}
			}
			if lost == 0 {
				if _, werr := sess.w.AppendFramed(k, buf[:journal.HeaderSize+n]); werr == nil {
					sess.notify()
				} else {
					sess.lostOutput(k, werr)
					lost = n
				}
			} else if lost > 0 {
				lost += n
			}
			if n == size && size < max {
				size *= 4
				if size > max {
					size = max
				}
				buf = make([]byte, journal.HeaderSize+size)
			}
		}
		if err != nil {
			return
		}
	}
}

// drainGrace is how long output is still read after the process exited
// (a background child may hold the pipes open).
const drainGrace = 250 * time.Millisecond

func (s *server) run(sess *session, outR, errR, outW, errW *os.File) {
	var pumps sync.WaitGroup
	pumps.Add(1)
	go func() { defer pumps.Done(); pump(sess, outR, journal.KindStdout, 1<<20) }()
	if errR != nil {
		pumps.Add(1)
		go func() { defer pumps.Done(); pump(sess, errR, journal.KindStderr, 256<<10) }()
	}
	code, sig, err := sess.proc.Wait()
	close(sess.ended)
	var limit *LimitError
	if errors.As(err, &limit) {
		err = nil // the exit status is the real one
	}
	if sess.budget != nil {
		sess.budget.Stop()
	}
	outW.Close()
	if errW != outW {
		errW.Close()
	}
	// No exit status (the sandbox's init died under the command): the
	// journal gets no exit record, so readers report the session lost
	// (closed before exit), as when the supervisor itself dies, never a
	// made-up code.
	lost := err != nil && code == 0 && sig == 0
	if lost {
		s.log.Warn("session ended without an exit status", "id", sess.id, "err", err)
	}
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		_ = outR.SetReadDeadline(time.Now())
		if errR != nil {
			_ = errR.SetReadDeadline(time.Now())
		}
		<-drained
	}
	if sess.tty {
		outR = nil // the pty master is also stdin: closed below
	} else {
		outR.Close()
	}
	if errR != nil {
		errR.Close()
	}
	// Stdin answers "exited" from before anyone can read the exit record.
	// A write blocked on a pipe a leftover child holds is cut short.
	if sess.stdinRef != nil {
		_ = sess.stdinRef.SetWriteDeadline(time.Now())
	}
	sess.stdinMu.Lock()
	sess.finished = true
	if sess.stdin != nil {
		sess.stdin.Close()
		sess.stdin = nil
	}
	sess.stdinMu.Unlock()
	if sess.overtime.Load() {
		k := journal.KindStderr
		if sess.tty {
			k = journal.KindStdout
		}
		_, _ = sess.w.Append(k, []byte(BudgetMessage(sess.meta.Budget)))
	} else if limit != nil {
		k := journal.KindStderr
		if sess.tty {
			k = journal.KindStdout
		}
		_, _ = sess.w.Append(k, []byte(LimitMessage(limit.Limit, limit.Evidence)))
	}
	// The exit mark is written only once the journal is on the disk
	// (journal's package doc, Durability): after a crash of the host a
	// session marked exited has its whole journal, exit record included.
	// Followers are told of the exit record first, so the sync costs
	// them nothing.
	mark := "lost" // ended: nothing to reap
	if !lost {
		_, _ = sess.w.AppendExit(code, sig)
		sess.notify()
		mark = strconv.Itoa(code)
	}
	if err := sess.w.Sync(); err != nil && s.log != nil {
		s.log.Warn("session journal not synced", "id", sess.id, "err", err)
	}
	_ = writeFileAtomic(filepath.Join(sess.dir, exitName), []byte(mark))
	sess.w.Close()
	sess.mu.Lock()
	sess.done = true
	close(sess.exited)
	close(sess.changed)
	sess.changed = make(chan struct{})
	sess.mu.Unlock()
	s.prune()
}
