package journal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func collect(t *testing.T, r *Reader, limit int64) []Record {
	t.Helper()
	var out []Record
	if _, err := r.Read(limit, func(rec Record) error { out = append(out, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	w, err := Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := Create(p); err == nil {
		t.Fatal("Create of an existing journal succeeded")
	}
	w.Append(KindStdout, []byte("ready\n"))
	w.Append(KindStderr, []byte("warn"))
	big := bytes.Repeat([]byte("x"), 3*DefaultChunk+17)
	w.Append(KindStdout, big)
	size, _ := w.AppendExit(143, 15)
	if size != w.Size() {
		t.Fatalf("size %d != %d", size, w.Size())
	}
	for _, chunk := range []int{1, 7, 64, DefaultChunk} {
		r, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		r.chunk = chunk
		recs := collect(t, r, size)
		r.Close()
		if len(recs) != 4 {
			t.Fatalf("chunk %d: %d records", chunk, len(recs))
		}
		if string(recs[0].Data) != "ready\n" || recs[0].Kind != KindStdout || recs[0].Offset != 0 {
			t.Fatalf("chunk %d: first record %+v", chunk, recs[0])
		}
		if string(recs[1].Data) != "warn" || recs[1].Kind != KindStderr {
			t.Fatalf("second record %+v", recs[1])
		}
		if !bytes.Equal(recs[2].Data, big) {
			t.Fatalf("chunk %d: big record of %d bytes", chunk, len(recs[2].Data))
		}
		if recs[3].Kind != KindExit || recs[3].Code != 143 || recs[3].Signal != 15 {
			t.Fatalf("exit record %+v", recs[3])
		}
	}
}

func TestTornTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	w, _ := Create(p)
	w.Append(KindStdout, []byte("whole"))
	w.Close()
	// A writer killed in the middle of a write: a header promising 10 bytes, 3 present.
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{byte(KindStdout), 0, 0, 0, 10, 'a', 'b', 'c'})
	f.Close()
	r, _ := Open(p)
	defer r.Close()
	recs := collect(t, r, -1)
	if len(recs) != 1 || string(recs[0].Data) != "whole" {
		t.Fatalf("records %+v", recs)
	}
	k, data, ok := r.Tail()
	if !ok || k != KindStdout || string(data) != "abc" {
		t.Fatalf("tail %v %q %v", k, data, ok)
	}
}

func TestCorrupt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	os.WriteFile(p, []byte{9, 0, 0, 0, 1, 'x'}, 0o600)
	r, _ := Open(p)
	defer r.Close()
	if _, err := r.Read(-1, func(Record) error { return nil }); err == nil {
		t.Fatal("corrupt kind accepted")
	}
}

// Several readers tail one writer at once; each sees every record exactly once.
func TestConcurrentReaders(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	w, _ := Create(p)
	defer w.Close()
	const n = 2000
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := Open(p)
			if err != nil {
				errs <- err
				return
			}
			defer r.Close()
			next := 0
			for next < n {
				_, err := r.Read(w.Size(), func(rec Record) error {
					if want := fmt.Sprint(next); string(rec.Data) != want {
						return fmt.Errorf("got %q want %q", rec.Data, want)
					}
					next++
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		w.Append(KindStdout, []byte(fmt.Sprint(i)))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func BenchmarkReplay(b *testing.B) {
	p := filepath.Join(b.TempDir(), "j")
	w, _ := Create(p)
	chunk := make([]byte, 64<<10)
	const total = 256 << 20
	for i := 0; i < total/len(chunk); i++ {
		w.Append(KindStdout, chunk)
	}
	w.Close()
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, _ := Open(p)
		var got int
		r.Read(-1, func(rec Record) error { got += len(rec.Data); return nil })
		r.Close()
		if got != total {
			b.Fatalf("read %d", got)
		}
	}
}

// FuzzRead: any file content reads back without a panic, and a journal
// written by a Writer reads back exactly, whatever the chunk size.
func FuzzRead(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 'h', 'i', 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0}, 3)
	f.Add([]byte{2, 0, 0, 0, 10, 'a'}, 1)
	f.Add([]byte{9}, 64)
	f.Fuzz(func(t *testing.T, content []byte, chunk int) {
		if chunk <= 0 || chunk > 1<<20 {
			chunk = 7
		}
		dir := t.TempDir()
		p := filepath.Join(dir, "raw")
		os.WriteFile(p, content, 0o600)
		r, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		r.chunk = chunk
		_, _ = r.Read(-1, func(Record) error { return nil })
		r.Tail()
		r.Close()

		// Round trip: content split into records of varied kinds and sizes.
		jp := filepath.Join(dir, "j")
		w, _ := Create(jp)
		var want [][]byte
		for i := 0; len(content) > 0; i++ {
			n := 1 + (i*31)%len(content)
			k := KindStdout
			if i%2 == 1 {
				k = KindStderr
			}
			w.Append(k, content[:n])
			want = append(want, content[:n])
			content = content[n:]
		}
		w.AppendExit(3, 0)
		w.Close()
		r, _ = Open(jp)
		defer r.Close()
		r.chunk = chunk
		var got [][]byte
		exit := false
		if _, err := r.Read(-1, func(rec Record) error {
			if rec.Kind == KindExit {
				exit = rec.Code == 3
			} else {
				got = append(got, rec.Data)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !exit || len(got) != len(want) {
			t.Fatalf("got %d records exit %v, want %d", len(got), exit, len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("record %d differs", i)
			}
		}
	})
}

// A large record read while its writer is still writing it is delivered
// once, whole, when it is complete; torn, Tail gives what reached the file.
func TestLargeRecordInParts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	w, _ := Create(p)
	w.Append(KindStderr, []byte("first"))
	w.Close()
	const l = 1 << 20
	data := make([]byte, l)
	for i := range data {
		data[i] = byte(i * 7)
	}
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	defer f.Close()
	f.Write([]byte{byte(KindStdout), 0, 0x10, 0, 0})
	r, _ := Open(p)
	defer r.Close()
	r2, _ := Open(p)
	defer r2.Close()
	var got []Record
	for i, part := range [][]byte{data[:1000], data[1000:300000], data[300000 : l-1], data[l-1:]} {
		f.Write(part)
		if _, err := r.Read(-1, func(rec Record) error { got = append(got, rec); return nil }); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			k, tail, ok := r.Tail()
			if !ok || k != KindStdout || !bytes.Equal(tail, data[:l-1]) {
				t.Fatalf("tail %v %d bytes %v", k, len(tail), ok)
			}
		}
	}
	if len(got) != 2 || string(got[0].Data) != "first" || got[1].Kind != KindStdout || !bytes.Equal(got[1].Data, data) || got[1].Offset != 10 {
		t.Fatalf("got %d records", len(got))
	}
	if r.Offset() != 10+HeaderSize+l {
		t.Fatalf("offset %d", r.Offset())
	}
	// A reader that starts after the record is whole sees the same.
	if recs := collect(t, r2, -1); len(recs) != 2 || !bytes.Equal(recs[1].Data, data) {
		t.Fatalf("second reader: %d records", len(recs))
	}
}

// TestOpenAppendCutsATornRecord: a journal whose last record is torn (its
// writer killed in the middle of a splice: the header says more than
// follows) is cut back to its last whole record when opened for
// appending, so what is appended next reads back as itself, not as the
// rest of the torn record. So is a torn header.
func TestOpenAppendCutsATornRecord(t *testing.T) {
	for _, torn := range [][]byte{
		{byte(KindStdout), 0, 0, 0, 100, 'x', 'y'}, // a record of 100 bytes, 2 written
		{byte(KindStdout), 0, 0},                   // a header in part
	} {
		p := filepath.Join(t.TempDir(), "j")
		w, err := Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(KindStdout, []byte("whole")); err != nil {
			t.Fatal(err)
		}
		w.Close()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(torn); err != nil {
			t.Fatal(err)
		}
		f.Close()
		w, err = OpenAppend(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(KindStdout, []byte("after")); err != nil {
			t.Fatal(err)
		}
		if _, err := w.AppendExit(3, 0); err != nil {
			t.Fatal(err)
		}
		w.Close()
		r, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		recs := collect(t, r, -1)
		r.Close()
		if len(recs) != 3 || string(recs[0].Data) != "whole" || string(recs[1].Data) != "after" || recs[2].Kind != KindExit || recs[2].Code != 3 {
			t.Fatalf("torn %q: read back %+v", torn, recs)
		}
	}
}
