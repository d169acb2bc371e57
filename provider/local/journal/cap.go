package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A running session's journal is bounded too (Writer.SetCap): once the
// records kept pass the cap, the oldest ones are dropped, down to half the
// cap, at a record boundary, so a command that writes without end (an
// unattached `yes`) cannot fill the disk. Dropping punches a hole in the
// file (fallocate PUNCH_HOLE): the blocks are freed while every offset
// stays where it was, so readers and the supervisor's byte addresses need
// no renumbering. The head, the offset of the first record kept, is
// written to a sidecar file (the journal's name + HeadSuffix) before the
// hole is punched; a reader that finds itself before the head jumps to it
// and reports how many bytes it skipped (Reader.Skipped), so an attach
// says that older output was dropped instead of delivering zeros. Where
// the filesystem cannot punch holes the cap is not enforced (SetCap
// reports it). SetFloor keeps every record from a reader's position on:
// the supervisor sets it to its slowest follower's, so the cap drops only
// what every follower has read.

// HeadSuffix names a journal's head file: 8 bytes, big endian, the offset
// of its first record kept. No file means nothing was dropped.
const HeadSuffix = ".head"

// ErrCapUnsupported: the journal's filesystem cannot punch holes.
var ErrCapUnsupported = errors.New("journal: the filesystem cannot drop a journal's oldest bytes (no hole punching)")

// markEvery: the writer remembers the first record boundary past every
// markEvery bytes, the places it may drop up to.
const markEvery = 1 << 20

// SetCap bounds the records w keeps to about n bytes (0: no bound). It
// probes that the file can have holes punched and returns
// ErrCapUnsupported when it cannot.
func (w *Writer) SetCap(n int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= 0 {
		w.cap = 0
		return nil
	}
	// Punching an empty range tells whether the filesystem can.
	if err := unix.Fallocate(int(w.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 1); err != nil {
		return fmt.Errorf("%w: %v", ErrCapUnsupported, err)
	}
	w.cap = n
	return nil
}

// SetFloor keeps every record from offset floor on whatever the cap
// (floor < 0: no floor): a reader's position, whose unread output the
// cap must not drop. The records kept then pass the cap until the floor
// moves on; a writer that bounds the disk keeps its own writes back
// meanwhile (the supervisor holds the command).
func (w *Writer) SetFloor(floor int64) {
	w.mu.Lock()
	w.floor = floor
	w.mu.Unlock()
}

// Head is the offset of the first record kept.
func (w *Writer) Head() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.head
}

// committed records a whole record at [off, end) and drops the oldest
// records when the cap is passed; under w.mu.
func (w *Writer) committed(off, end int64) {
	if len(w.marks) == 0 || off-w.marks[len(w.marks)-1] >= markEvery {
		w.marks = append(w.marks, off)
	}
	if w.cap <= 0 || end-w.head <= w.cap {
		return
	}
	target := end - w.cap/2
	if w.floor >= 0 && w.floor < target {
		target = w.floor // a reader is there yet (SetFloor)
	}
	i := 0
	for i < len(w.marks) && w.marks[i] <= target {
		i++
	}
	if i == 0 || w.marks[i-1] <= w.head {
		return // no boundary to drop to yet
	}
	head := w.marks[i-1]
	if err := w.writeHead(head); err != nil {
		return
	}
	if err := unix.Fallocate(int(w.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, head); err != nil {
		return
	}
	w.head = head
	w.marks = append(w.marks[:0], w.marks[i-1:]...)
}

func (w *Writer) writeHead(head int64) error {
	if w.headf == nil {
		f, err := os.OpenFile(w.f.Name()+HeadSuffix, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		w.headf = f
		if err := syncDir(filepath.Dir(f.Name())); err != nil {
			return err
		}
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(head))
	if _, err := w.headf.WriteAt(b[:], 0); err != nil {
		return err
	}
	// Durable before the hole is punched: after a crash no hole lies
	// past the head the disk holds (a reader would read its zeros).
	return fdatasync(w.headf)
}

// loadHead reads the head of the journal at path (0 without a head file).
func loadHead(path string) int64 {
	b, err := os.ReadFile(path + HeadSuffix)
	if err != nil || len(b) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

// scanMarks rebuilds an appending writer's boundaries from head to size.
func (w *Writer) scanMarks() {
	var h [HeaderSize]byte
	for off := w.head; off < w.size; {
		if _, err := w.f.ReadAt(h[:], off); err != nil {
			return
		}
		if len(w.marks) == 0 || off-w.marks[len(w.marks)-1] >= markEvery {
			w.marks = append(w.marks, off)
		}
		off += HeaderSize + int64(binary.BigEndian.Uint32(h[1:]))
	}
}

// readHead is the reader's current view of the head.
func (r *Reader) readHead() int64 {
	if r.headf == nil {
		f, err := os.Open(r.f.Name() + HeadSuffix)
		if err != nil {
			return 0
		}
		r.headf = f
	}
	var b [8]byte
	if _, err := r.headf.ReadAt(b[:], 0); err != nil && err != io.EOF {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b[:]))
}

// behind moves the reader to the head when what it has not delivered yet
// was dropped (its bytes may read as zeros), and reports whether it moved.
func (r *Reader) behind() bool {
	head := r.readHead()
	if head <= r.pendOff {
		return false
	}
	r.skipped += head - r.pendOff
	r.pendOff, r.off = head, head
	r.pending, r.big = r.pending[:0], nil
	return true
}

// Skipped is how many bytes of the journal the reader jumped over because
// the writer's cap had dropped them before the reader got there.
func (r *Reader) Skipped() int64 { return r.skipped }

// syncDir makes dir's entries (a file created or renamed in it) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
