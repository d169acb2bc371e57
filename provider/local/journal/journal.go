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
// with one write(2) on an O_APPEND file, so a reader that opens the file at
// any time and reads from byte zero sees every record exactly once, in
// order; several readers at once each see the whole journal. No byte is
// buffered in user space: once Append returns, the record is in the kernel
// and survives a kill -9 of the writer. A writer killed in the middle of a
// large write can leave a torn last record; a reader reports its data as
// far as it goes (Reader.Tail), never a fabricated exit.
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
	mu   sync.Mutex
	f    *os.File
	size int64
	done bool
}

// Create creates a new journal at path; it fails if path exists.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// OpenAppend opens an existing journal for appending (after a restart).
func OpenAppend(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Writer{f: f, size: st.Size()}, nil
}

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
	n, err := w.f.Write(buf)
	w.size += int64(n)
	return w.size, err
}

// AppendExit writes the exit record.
func (w *Writer) AppendExit(code, signal int) (int64, error) {
	var b [HeaderSize + 8]byte
	binary.BigEndian.PutUint32(b[HeaderSize:], uint32(int32(code)))
	binary.BigEndian.PutUint32(b[HeaderSize+4:], uint32(int32(signal)))
	return w.AppendFramed(KindExit, b[:])
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
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
	off     int64 // file offset of the next byte to read
	pending []byte
	pendOff int64 // offset of pending[0]
	chunk   int
}

// DefaultChunk is how much a Reader reads per call by default.
const DefaultChunk = 1 << 20

// Open opens the journal at path for reading from byte zero.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &Reader{f: f, chunk: DefaultChunk}, nil
}

// Close closes the reader's file.
func (r *Reader) Close() error { return r.f.Close() }

// Offset is the offset of the first record not yet returned.
func (r *Reader) Offset() int64 { return r.pendOff }

// Read reads whole records from the reader's position up to limit (a
// committed size; a negative limit means the end of the file) and calls fn
// for each, in order. It returns how many records it delivered. Records are
// read in chunks of up to DefaultChunk bytes, so a large backlog is
// delivered in several calls' worth of fn calls without holding it all in
// memory; Read returns only when it reached limit (or EOF), or fn returned
// an error.
func (r *Reader) Read(limit int64, fn func(Record) error) (int, error) {
	count := 0
	for {
		if limit >= 0 && r.off >= limit {
			return count, nil
		}
		want := int64(r.chunk)
		if limit >= 0 && limit-r.off < want {
			want = limit - r.off
		}
		// A record larger than the chunk: grow the read to hold it.
		if len(r.pending) >= HeaderSize {
			need := int64(HeaderSize) + int64(binary.BigEndian.Uint32(r.pending[1:HeaderSize])) - int64(len(r.pending))
			if need > want && (limit < 0 || r.off+need <= limit) {
				want = need
			}
		}
		buf := make([]byte, len(r.pending)+int(want))
		copy(buf, r.pending)
		n, err := r.f.ReadAt(buf[len(r.pending):], r.off)
		r.off += int64(n)
		buf = buf[:len(r.pending)+n]
		if n == 0 {
			if err == io.EOF || err == nil {
				return count, nil
			}
			return count, err
		}
		start := r.pendOff
		p := 0
		for {
			if len(buf)-p < HeaderSize {
				break
			}
			k := Kind(buf[p])
			l := int(binary.BigEndian.Uint32(buf[p+1 : p+HeaderSize]))
			if (k != KindStdout && k != KindStderr && k != KindExit) || l > MaxRecord {
				return count, fmt.Errorf("%w at offset %d", ErrCorrupt, start+int64(p))
			}
			if len(buf)-p-HeaderSize < l {
				break
			}
			data := buf[p+HeaderSize : p+HeaderSize+l : p+HeaderSize+l]
			rec := Record{Kind: k, Offset: start + int64(p)}
			if k == KindExit {
				if l < 8 {
					return count, fmt.Errorf("%w: short exit record at offset %d", ErrCorrupt, rec.Offset)
				}
				rec.Code = int(int32(binary.BigEndian.Uint32(data[0:4])))
				rec.Signal = int(int32(binary.BigEndian.Uint32(data[4:8])))
			} else {
				rec.Data = data
			}
			p += HeaderSize + l
			r.pendOff = start + int64(p)
			count++
			if err := fn(rec); err != nil {
				r.pending = append([]byte(nil), buf[p:]...)
				return count, err
			}
		}
		r.pending = append(r.pending[:0:0], buf[p:]...)
		if err != nil && err != io.EOF {
			return count, err
		}
		if err == io.EOF {
			return count, nil
		}
	}
}

// Tail returns the data of a torn last record (a writer killed in the
// middle of a write): its kind and the bytes that reached the file. It is
// meaningful only once the writer is known to be gone and Read(-1) has
// returned; ok is false when there is no torn record.
func (r *Reader) Tail() (k Kind, data []byte, ok bool) {
	if len(r.pending) < HeaderSize {
		return 0, nil, false
	}
	k = Kind(r.pending[0])
	if k != KindStdout && k != KindStderr {
		return 0, nil, false
	}
	return k, append([]byte(nil), r.pending[HeaderSize:]...), true
}
