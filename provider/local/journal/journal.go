// Package journal is the append-only, byte-addressed record of one session's
// output: every chunk a command wrote to stdout or stderr, in the order the
// supervisor read them, and finally the exit status.
//
// The file is a sequence of framed records
//
//	[kind byte][length uint32, big endian][data]
//
// where kind is KindStdout, KindStderr or KindExit (data: the exit code as
// an int32, big endian, then the signal as an int32). A record is written
// with one write(2) at the journal's end (or a header write and a splice(2)
// of the data straight from a pipe, AppendSplice), so a reader that opens the file at
// any time and reads from byte zero sees every record exactly once, in
// order; several readers at once each see the whole journal. No byte is
// buffered in user space: once Append returns, the record is in the kernel
// and survives a kill -9 of the writer. A writer killed in the middle of a
// large write can leave a torn last record; a reader reports its data as
// far as it goes (Reader.Tail), never a fabricated exit.
//
// Durability. Surviving a kill -9 is not surviving a crash of the kernel,
// a power cut or a filesystem shut down under it (a remount after a host
// reboot): records still in the page cache are gone then. The journal is
// on the hot output path, so Append does not fsync, nor start the
// writeback early (sync_file_range every 8 MiB held the pump to the
// disk's speed); the writer's owner calls Sync where a reader or a restart relies on
// what is there: the supervisor syncs a session's journal once the exit
// record is appended, before it writes the session's exit mark (so a
// mark that survives a crash means the journal before it did too), and
// at its checkpoints (a suspend, and the journals a killed predecessor
// left, before they are marked lost). The cap's head file (cap.go) is
// synced before the hole below it is punched, so a crash never leaves a
// hole past the head the disk holds. After a crash the journal holds a prefix of its records, at most
// one torn at its end (OpenAppend and Reader.Tail handle it), never a
// record out of order. The cost is paid once per session, after its
// followers were told of the exit: 0.4 to 0.7 s for a 256 MiB session on
// this project's CI disk (go test -run '^$' -bench SessionEndSync
// -benchtime 3x ./provider/local/supervisor/: sync-ms against nosync-ms).
//
// This is hand-written rather than taken from a library: what is needed is a
// few dozen lines over os.File (a write-ahead-log library would add
// segmenting, checksums and fsync policies that the journal's contract, one
// reader-visible order per session, does not need).
package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Kind is a record's kind.
type Kind byte

// The record kinds.
const (
	KindStdout Kind = 1
	KindStderr Kind = 2
	KindExit   Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindStdout:
		return "stdout"
	case KindStderr:
		return "stderr"
	case KindExit:
		return "exit"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// HeaderSize is the size of a record's frame header.
const HeaderSize = 5

// MaxRecord is the largest data a record may carry.
const MaxRecord = 16 << 20

// ErrCorrupt means the journal holds a record that no writer produces.
var ErrCorrupt = errors.New("journal: corrupt record")

// Writer appends records to a journal. It is safe for concurrent use.
type Writer struct {
	mu    sync.Mutex
	f     *os.File
	size  int64
	done  bool
	cap   int64    // bound on the records kept (SetCap); 0: none
	floor int64    // the cap drops nothing from here on (SetFloor); < 0: none
	head  int64    // offset of the first record kept
	marks []int64  // record boundaries the writer may drop up to (cap.go)
	headf *os.File // the head file, once written
}

// Create creates a new journal at path; it fails if path exists.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, floor: -1}, nil
}

// OpenAppend opens an existing journal for appending (after a restart).
func OpenAppend(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0) // read too: its records are scanned
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	w := &Writer{f: f, size: st.Size(), head: loadHead(path), floor: -1}
	w.scanMarks()
	// A record torn at the end (its writer killed in the middle of it,
	// or a crash before its data reached the disk) is cut off: an append
	// after it would be read as the rest of it.
	if end := w.wholeEnd(); end < w.size {
		if err := f.Truncate(end); err != nil {
			f.Close()
			return nil, err
		}
		w.size = end
	}
	return w, nil
}

// wholeEnd is the end of the journal's last whole record.
func (w *Writer) wholeEnd() int64 {
	var h [HeaderSize]byte
	off := w.head
	for off < w.size {
		n, err := w.f.ReadAt(h[:], off)
		if n < HeaderSize && err == io.EOF {
			return off // a header torn
		}
		if err != nil && n < HeaderSize {
			return w.size // unreadable: nothing is cut
		}
		next := off + HeaderSize + int64(binary.BigEndian.Uint32(h[1:]))
		if next > w.size {
			return off
		}
		off = next
	}
	return off
}

// Name is the journal's file name.
func (w *Writer) Name() string { return w.f.Name() }

// Size is the journal's committed length: every record before it is whole.
func (w *Writer) Size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size
}

// Append writes one record and returns the journal's new size.
func (w *Writer) Append(k Kind, data []byte) (int64, error) {
	buf := make([]byte, HeaderSize+len(data))
	copy(buf[HeaderSize:], data)
	return w.AppendFramed(k, buf)
}

// AppendFramed writes one record whose data is buf[HeaderSize:]; the first
// HeaderSize bytes of buf are overwritten with the header. It saves a copy
// for callers that read into buf[HeaderSize:].
func (w *Writer) AppendFramed(k Kind, buf []byte) (int64, error) {
	if len(buf) < HeaderSize || len(buf)-HeaderSize > MaxRecord {
		return 0, fmt.Errorf("journal: record of %d bytes", len(buf)-HeaderSize)
	}
	buf[0] = byte(k)
	binary.BigEndian.PutUint32(buf[1:HeaderSize], uint32(len(buf)-HeaderSize))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return w.size, errors.New("journal: closed")
	}
	if _, err := w.f.WriteAt(buf, w.size); err != nil {
		// A record written in part (a full disk) is cut off again, so
		// the journal ends at its last whole record and the next append
		// starts there.
		_ = w.f.Truncate(w.size)
		return w.size, err
	}
	w.committed(w.size, w.size+int64(len(buf)))
	w.size += int64(len(buf))
	return w.size, nil
}

// AppendSplice writes one record of n bytes moved from the pipe fd
// straight into the journal with splice(2), with no copy through user
// space. The pipe must hold at least n bytes, and only the caller may read
// it.
func (w *Writer) AppendSplice(k Kind, fd int, n int) (int64, error) {
	if n <= 0 || n > MaxRecord {
		return 0, fmt.Errorf("journal: record of %d bytes", n)
	}
	var h [HeaderSize]byte
	h[0] = byte(k)
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return w.size, errors.New("journal: closed")
	}
	if _, err := w.f.WriteAt(h[:], w.size); err != nil {
		_ = w.f.Truncate(w.size)
		return w.size, err
	}
	off := w.size + HeaderSize
	sc, err := w.f.SyscallConn()
	if err != nil {
		return w.size, err
	}
	left := n
	var serr error
	cerr := sc.Control(func(out uintptr) {
		for left > 0 {
			m, err := unix.Splice(fd, nil, int(out), &off, left, unix.SPLICE_F_MOVE)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				serr = err
				return
			}
			if m == 0 {
				serr = io.ErrUnexpectedEOF
				return
			}
			left -= int(m)
		}
	})
	if cerr != nil {
		serr = cerr
	}
	if serr != nil {
		// The record is torn: cut it off; the journal ends before it.
		_ = w.f.Truncate(w.size)
		return w.size, serr
	}
	w.committed(w.size, w.size+HeaderSize+int64(n))
	w.size += HeaderSize + int64(n)
	return w.size, nil
}

// AppendExit writes the exit record.
func (w *Writer) AppendExit(code, signal int) (int64, error) {
	var b [HeaderSize + 8]byte
	binary.BigEndian.PutUint32(b[HeaderSize:], uint32(int32(code)))
	binary.BigEndian.PutUint32(b[HeaderSize+4:], uint32(int32(signal)))
	return w.AppendFramed(KindExit, b[:])
}

// Sync flushes the journal's records to the disk (fdatasync): once it
// returns, every record appended before it survives a crash of the host.
// It is a checkpoint, not a per-record cost: see the package doc.
func (w *Writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return errors.New("journal: closed")
	}
	return fdatasync(w.f)
}

// fdatasync flushes f's data and the metadata needed to read it (its size).
func fdatasync(f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := sc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// SyncFile syncs the journal at path, a journal whose writer is gone (a
// supervisor killed before it synced it): whatever of it the page cache
// still holds reaches the disk.
func SyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return fdatasync(f)
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
	if w.headf != nil {
		w.headf.Close()
	}
	return w.f.Close()
}

// Record is one record read back.
type Record struct {
	Kind   Kind
	Offset int64  // the offset of the record's header
	Data   []byte // output data (stdout, stderr); owned by the caller
	Code   int    // exit code (KindExit)
	Signal int    // the signal that ended the command, 0 if none (KindExit)
}

// Reader reads a journal's records in order from an offset. It is not safe
// for concurrent use; each attacher has its own.
type Reader struct {
	f       *os.File
	off     int64  // file offset of the next byte to read
	pending []byte // read ahead, not yet delivered (a window into buf)
	buf     []byte
	pendOff int64 // offset of pending[0]
	chunk   int
	// big is a large record read straight into its own buffer and not
	// whole yet (the writer is still writing it): len is what was read,
	// cap the record's length. Its header was consumed from pending.
	big     []byte
	bigKind Kind
	headf   *os.File // the journal's head file, once seen (cap.go)
	skipped int64    // bytes jumped over because the writer dropped them
}

// DefaultChunk is how much a Reader reads per call by default.
const DefaultChunk = 256 << 10

// Open opens the journal at path for reading from byte zero.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r := &Reader{f: f, chunk: DefaultChunk}
	r.behind()
	return r, nil
}

// Close closes the reader's file.
func (r *Reader) Close() error {
	if r.headf != nil {
		r.headf.Close()
	}
	return r.f.Close()
}

// Offset is the offset of the first record not yet returned.
func (r *Reader) Offset() int64 { return r.pendOff }

// Read reads whole records from the reader's position up to limit (a
// committed size; a negative limit means the end of the file) and calls fn
// for each, in order. It returns how many records it delivered. It reads
// ahead in chunks of DefaultChunk bytes; a record larger than what is left
// of a chunk is read straight into its own buffer, so data is copied once;
// when it is not whole yet (the writer is still writing it) the buffer is
// kept and the next call goes on filling it.
// Each Record's Data is a fresh allocation the caller may keep. Read
// returns when it reached limit (or EOF), or fn returned an error.
func (r *Reader) Read(limit int64, fn func(Record) error) (int, error) {
	count := 0
	// A capped journal's oldest records may be gone (cap.go): after every
	// read from the file, behind checks that what was read was not
	// dropped meanwhile, and jumps to the head if it was.
	r.behind()
	for {
		if r.big != nil {
			// Go on filling the large record a previous call began.
			have, l := len(r.big), cap(r.big)
			if limit >= 0 && r.off+int64(l-have) > limit {
				return count, nil // not committed yet
			}
			n, err := r.f.ReadAt(r.big[have:l], r.off)
			if r.behind() {
				continue
			}
			r.off += int64(n)
			r.big = r.big[:have+n]
			if have+n < l {
				if err != nil && err != io.EOF {
					return count, err
				}
				return count, nil
			}
			rec := Record{Kind: r.bigKind, Offset: r.pendOff, Data: r.big}
			r.big = nil
			r.pendOff += int64(HeaderSize + l)
			count++
			if err := fn(rec); err != nil {
				return count, err
			}
			continue
		}
		// Make sure a header is buffered.
		if len(r.pending) < HeaderSize {
			more, err := r.fill(limit, HeaderSize-len(r.pending))
			if r.behind() {
				continue
			}
			if !more {
				return count, err
			}
			continue
		}
		k := Kind(r.pending[0])
		l := int(binary.BigEndian.Uint32(r.pending[1:HeaderSize]))
		if (k != KindStdout && k != KindStderr && k != KindExit) || l > MaxRecord {
			if r.behind() {
				continue
			}
			return count, fmt.Errorf("%w at offset %d", ErrCorrupt, r.pendOff)
		}
		avail := len(r.pending) - HeaderSize
		if avail < l {
			if limit >= 0 && r.off+int64(l-avail) > limit {
				return count, nil // not committed yet
			}
			if l-avail > r.chunk/2 {
				// Large record: read the rest of it straight into its buffer.
				data := make([]byte, l)
				copy(data, r.pending[HeaderSize:])
				n, err := r.f.ReadAt(data[avail:], r.off)
				if r.behind() {
					continue
				}
				r.off += int64(n)
				r.pending = r.pending[:0]
				if n < l-avail {
					// Torn or still being written: keep the buffer and
					// what it holds; the next call goes on filling it.
					r.big, r.bigKind = data[:avail+n], k
					if err != nil && err != io.EOF {
						return count, err
					}
					return count, nil
				}
				rec := Record{Kind: k, Offset: r.pendOff, Data: data}
				r.pendOff += int64(HeaderSize + l)
				count++
				if err := fn(r.finish(rec)); err != nil {
					return count, err
				}
				continue
			}
			more, err := r.fill(limit, l-avail)
			if r.behind() {
				continue
			}
			if !more {
				return count, err
			}
			continue
		}
		data := make([]byte, l)
		copy(data, r.pending[HeaderSize:HeaderSize+l])
		r.pending = r.pending[HeaderSize+l:]
		rec := Record{Kind: k, Offset: r.pendOff, Data: data}
		r.pendOff += int64(HeaderSize + l)
		count++
		if k == KindExit && l < 8 {
			return count, fmt.Errorf("%w: short exit record at offset %d", ErrCorrupt, rec.Offset)
		}
		if err := fn(r.finish(rec)); err != nil {
			return count, err
		}
	}
}

func (r *Reader) finish(rec Record) Record {
	if rec.Kind == KindExit {
		rec.Code = int(int32(binary.BigEndian.Uint32(rec.Data[0:4])))
		rec.Signal = int(int32(binary.BigEndian.Uint32(rec.Data[4:8])))
		rec.Data = nil
	}
	return rec
}

// fill appends up to a chunk (at least need bytes when available) to
// pending. It reports whether anything was read.
func (r *Reader) fill(limit int64, need int) (bool, error) {
	want := r.chunk
	if want < need {
		want = need
	}
	if limit >= 0 {
		if left := limit - r.off; left < int64(want) {
			want = int(left)
		}
	}
	if want <= 0 {
		return false, nil
	}
	// Compact: move the unread tail to the front of a reused buffer.
	if cap(r.buf) < len(r.pending)+want {
		nb := make([]byte, len(r.pending), len(r.pending)+want)
		copy(nb, r.pending)
		r.buf = nb
	} else {
		r.buf = r.buf[:len(r.pending)]
		copy(r.buf, r.pending)
	}
	n, err := r.f.ReadAt(r.buf[len(r.pending):len(r.pending)+want], r.off)
	r.off += int64(n)
	r.pending = r.buf[:len(r.pending)+n]
	if n == 0 {
		if err == io.EOF {
			err = nil
		}
		return false, err
	}
	return true, nil
}

// Tail returns the data of a torn last record (a writer killed in the
// middle of a write): its kind and the bytes that reached the file. It is
// meaningful only once the writer is known to be gone and Read(-1) has
// returned; ok is false when there is no torn record.
func (r *Reader) Tail() (k Kind, data []byte, ok bool) {
	if r.big != nil {
		return r.bigKind, append([]byte(nil), r.big...), true
	}
	if len(r.pending) < HeaderSize {
		return 0, nil, false
	}
	k = Kind(r.pending[0])
	if k != KindStdout && k != KindStderr {
		return 0, nil, false
	}
	return k, append([]byte(nil), r.pending[HeaderSize:]...), true
}
