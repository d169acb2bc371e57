package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// The attacks below are what code in a sandbox can do to its own home
// while the provider copies it. The test makes the same changes from the
// host, on the home's host path: the file system sees the same renames.

// runSwapping runs f while a and b are exchanged over and over, and
// returns how many exchanges happened during it.
func runSwapping(a, b string, f func()) int {
	stop := make(chan struct{})
	done := make(chan struct{})
	var n int
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE) == nil {
				n++
			}
		}
	}()
	f()
	close(stop)
	<-done
	return n
}

func fill(t *testing.T, dir string, n int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// swapInLinks replaces dir, whenever it is a real directory, by a symlink
// to target (the real one moves aside), until stop is closed: what a
// sandbox does to its home to send a restore elsewhere. It returns the
// count of swaps once stop is closed and it has ended.
func swapInLinks(dir, target string, stop <-chan struct{}) <-chan int {
	res := make(chan int, 1)
	go func() {
		n := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				res <- n
				return
			default:
			}
			var st unix.Stat_t
			if unix.Lstat(dir, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			l := fmt.Sprintf("%s.l%d", dir, i)
			if os.Symlink(target, l) == nil && unix.Renameat2(unix.AT_FDCWD, l, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE) == nil {
				n++
			}
		}
	}()
	return res
}

// A restore writes the home while the sandbox swaps one of its
// directories for a symlink to a host directory: nothing may land there.
func TestRestoreNeverWritesOutsideTheHome(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "restore-race", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	fill(t, filepath.Join(home, "zz"), 1500)
	if err := os.WriteFile(filepath.Join(home, "zz", "zzz-payload"), []byte("from the sandbox"), 0o777); err != nil {
		t.Fatal(err)
	}
	id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	victim := t.TempDir()
	swaps := 0
	for round := 0; round < 3; round++ {
		stop := make(chan struct{})
		n := swapInLinks(filepath.Join(home, "zz"), victim, stop)
		_ = p.RestoreCheckpoint(ctx, h, id) // may fail: the tree moved under it
		close(stop)
		swaps += <-n
		if ents, _ := os.ReadDir(victim); len(ents) > 0 {
			t.Fatalf("round %d: the restore wrote %d entries into the host directory behind the symlink (first %s)", round, len(ents), ents[0].Name())
		}
	}
	if swaps == 0 {
		t.Fatal("no swap happened during the restores: the test did not attack")
	}
	t.Logf("%d swaps during 3 restores", swaps)
}

// A snapshot reads the home while the sandbox swaps a directory with a
// symlink to a host directory: no host file may enter the checkpoint.
func TestCheckpointNeverReadsOutsideTheHome(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "snapshot-race", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	fill(t, filepath.Join(home, "aa"), 1000) // listed and copied first: time for the swap to land
	if err := os.Mkdir(filepath.Join(home, "zz"), 0o755); err != nil {
		t.Fatal(err)
	}
	secret := t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, "secret.txt"), []byte("HOST-SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(home, "zzl")); err != nil {
		t.Fatal(err)
	}
	swaps := runSwapping(filepath.Join(home, "zz"), filepath.Join(home, "zzl"), func() {
		for range 3 {
			if _, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{}); err != nil {
				t.Errorf("checkpoint: %v", err)
			}
		}
	})
	if swaps == 0 {
		t.Fatal("no exchange happened during the checkpoints: the test did not attack")
	}
	err = filepath.WalkDir(p.checkpointsDir(mustRecord(t, p, h).InstanceID), func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if bytes.Contains(b, []byte("HOST-SECRET")) {
			return fmt.Errorf("%s holds the host's secret", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustRecord(t *testing.T, p *Provider, h *sandbox.Handle) *record {
	t.Helper()
	r, _, err := p.load(h.Name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A restore brings back the owners, permission bits, times, symlinks and
// holes of the snapshot; setuid bits and fifos are left out.
func TestCheckpointKeepsWhatItShould(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "cp-attrs", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	at := func(name string) string { return filepath.Join(home, name) }
	past := time.Date(2020, 1, 2, 3, 4, 5, 123456789, time.UTC) // to the nanosecond
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(at("d/e"), 0o750))
	must(os.WriteFile(at("d/e/owned"), []byte("by 1000"), 0o640))
	must(os.Lchown(at("d/e/owned"), 1000, 1001))
	must(os.Lchown(at("d/e"), 1000, 1001))
	must(os.Chtimes(at("d/e/owned"), past, past))
	must(os.WriteFile(at("suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(at("suid"), 0o4755))
	must(os.Symlink("d/e/owned", at("link")))
	must(unix.Mkfifo(at("fifo"), 0o644))
	sparse, err := os.Create(at("sparse"))
	must(err)
	must(sparse.Truncate(1 << 30))
	_, err = sparse.WriteAt([]byte("tail"), 1<<30-4)
	must(err)
	must(sparse.Close())
	must(os.Chtimes(at("d/e"), past, past))

	id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	must(err)
	for _, n := range []string{"d", "suid", "link", "fifo", "sparse"} {
		must(os.RemoveAll(at(n)))
	}
	must(p.RestoreCheckpoint(ctx, h, id))

	var st unix.Stat_t
	must(unix.Lstat(at("d/e/owned"), &st))
	if st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o640 {
		t.Errorf("owned: uid %d gid %d mode %o, want 1000 1001 640", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(past) { // Unix() is (sec, nsec)
		t.Errorf("owned: mtime %v, want %v", got, past)
	}
	must(unix.Lstat(at("d/e"), &st))
	if st.Uid != 1000 || st.Mode&0o777 != 0o750 || !time.Unix(st.Mtim.Unix()).Equal(past) {
		t.Errorf("d/e: uid %d mode %o mtime %v", st.Uid, st.Mode&0o777, time.Unix(st.Mtim.Unix()))
	}
	must(unix.Lstat(at("suid"), &st))
	if st.Mode&0o7777 != 0o755 {
		t.Errorf("suid: mode %o, want 755 (setuid dropped)", st.Mode&0o7777)
	}
	if l, err := os.Readlink(at("link")); err != nil || l != "d/e/owned" {
		t.Errorf("link: %q %v", l, err)
	}
	if _, err := os.Lstat(at("fifo")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a fifo was restored: %v", err)
	}
	must(unix.Stat(at("sparse"), &st))
	if st.Size != 1<<30 || st.Blocks*512 > 1<<20 {
		t.Errorf("sparse: size %d, %d bytes on disk: the holes were filled", st.Size, st.Blocks*512)
	}
	tail := make([]byte, 4)
	if f, err := os.Open(at("sparse")); err == nil {
		f.ReadAt(tail, 1<<30-4)
		f.Close()
	}
	if string(tail) != "tail" {
		t.Errorf("sparse: the data after the hole is %q", tail)
	}
}

// CreateCheckpointOnce's timeout bounds the copy of one big file too.
func TestCheckpointOnceTimeoutInsideAFile(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "cp-timeout", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = byte(i)
	}
	if err := os.WriteFile(filepath.Join(p.HostPath(h, "/home/sprite"), "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "slow", Timeout: time.Millisecond})
	var ue *sandbox.UnavailableError
	if !errors.As(err, &ue) || ue.Reason != "checkpoint_timeout" {
		t.Fatalf("a 1 ms checkpoint of 64 MiB: %v, want unavailable checkpoint_timeout", err)
	}
	if ids, _ := p.Checkpoints(ctx, h); len(ids) != 0 {
		t.Fatalf("a timed-out checkpoint left %v", ids)
	}
}

// ReadFile and WriteFile refuse what is not a regular file, at once, and
// never write through a hard link.
func TestFilesRefuseWhatIsNotARegularFile(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "not-regular", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	if err := unix.Mkfifo(filepath.Join(home, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(home, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	big, err := os.Create(filepath.Join(home, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	big.Truncate(1 << 40) // a terabyte of hole
	big.Close()
	invalid := func(what string, err error) {
		t.Helper()
		var ie *sandbox.InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("%s: %v (%T), want Invalid", what, err, err)
		}
	}
	// A fifo's open waits for the other end: it must not be opened so.
	fifo := make(chan [2]error, 1)
	go func() {
		_, rerr := p.ReadFile(ctx, h, "pipe")
		fifo <- [2]error{rerr, p.WriteFile(ctx, h, "pipe", []byte("x"), sandbox.WriteFileOptions{})}
	}()
	select {
	case errs := <-fifo:
		invalid("read a fifo", errs[0])
		invalid("write a fifo", errs[1])
	case <-time.After(10 * time.Second):
		unix.Open(filepath.Join(home, "pipe"), unix.O_RDWR|unix.O_NONBLOCK, 0) // let it go
		t.Fatal("a read or write of a fifo waited for a peer")
	}
	_, err = p.ReadFile(ctx, h, "dir")
	invalid("read a directory", err)
	_, err = p.ReadFile(ctx, h, "huge")
	invalid("read a terabyte", err)
	_, err = p.ReadFile(ctx, h, strings.Repeat("n", 300))
	invalid("a 300-byte name", err)

	// A hard link in the home to a file outside it (trusted code can make
	// one): the write replaces the link, the outside file is untouched.
	outside := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(outside, []byte("host data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(outside, filepath.Join(home, "hl")); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "hl", []byte("sandbox data"), sandbox.WriteFileOptions{Mode: 0o666}); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(outside, &st); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host data" || st.Mode&0o777 != 0o600 {
		t.Fatalf("the host file behind a hard link became %q, mode %o", b, st.Mode&0o777)
	}
	if b, _ := p.ReadFile(ctx, h, "hl"); string(b) != "sandbox data" {
		t.Fatalf("the sandbox's file: %q", b)
	}
	if ents, _ := os.ReadDir(home); len(ents) != 4 {
		t.Fatalf("the write left a temporary file: %v", ents)
	}
}

// deepTree makes depth nested directories named d under dir, from the
// host, the way a sandbox can (each made relative to the last: no path
// length limit), with a file at the bottom.
func deepTree(t *testing.T, dir string, depth int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	if f, err := unix.Openat(fd, "bottom", unix.O_CREAT|unix.O_WRONLY, 0o644); err == nil {
		unix.Close(f)
	}
	unix.Close(fd)
}

// A tree deeper than the process may hold descriptors (a sandbox makes one
// with mkdir d && cd d) neither blocks a restore nor the removal of the
// sandbox: removing it holds a few descriptors, not one per level.
func TestDeeperThanTheDescriptorLimit(t *testing.T) {
	// A low limit for the test's length makes "deeper than the limit" a
	// tree a test can afford.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 512
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	const depth = 1500
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "deep", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "keep", []byte("v1"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.WriteFile(ctx, h, "keep", []byte("v2"), sandbox.WriteFileOptions{})
	home := p.HostPath(h, "/home/sprite")
	deepTree(t, home, depth)
	if err := p.RestoreCheckpoint(ctx, h, id); err != nil {
		t.Fatalf("restore over a tree %d deep: %v", depth, err)
	}
	if b, _ := p.ReadFile(ctx, h, "keep"); string(b) != "v1" {
		t.Fatalf("restored %q", b)
	}
	if _, err := os.Lstat(filepath.Join(home, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deep tree survived the restore: %v", err)
	}
	deepTree(t, home, depth)
	inst := filepath.Dir(home)
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(inst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the instance with a tree %d deep survived its Destroy: %v", depth, err)
	}
}

// A file that cannot be removed (immutable) makes a restore fail, with a
// reason, instead of looping for ever on it.
func TestRestoreOverWhatCannotBeRemoved(t *testing.T) {
	testenv.RequireRoot(t)
	chattr, err := exec.LookPath("chattr")
	testenv.Require(t, err == nil, "chattr (e2fsprogs) is not installed")
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "immutable", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(p.HostPath(h, "/home/sprite"), "d")
	os.Mkdir(dir, 0o755)
	stuck := filepath.Join(dir, "stuck")
	os.WriteFile(stuck, []byte("x"), 0o644)
	if out, err := exec.Command(chattr, "+i", stuck).CombinedOutput(); err != nil {
		testenv.Require(t, false, fmt.Sprintf("chattr +i on the test's file system: %v %s", err, out))
	}
	t.Cleanup(func() { exec.Command(chattr, "-i", stuck).Run() })
	done := make(chan error, 1)
	go func() { done <- p.RestoreCheckpoint(ctx, h, id) }()
	select {
	case err := <-done:
		var rf *sandbox.RestoreFailedError
		if !errors.As(err, &rf) {
			t.Fatalf("restore over an immutable file: %v, want restore failed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("restore over an immutable file did not return")
	}
}

// allocDuring is what f allocates on the heap (all goroutines).
func allocDuring(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestFilesStream: OpenFile reads a 1000 MB sparse file, and
// WriteFileFrom writes 256 MiB, each allocating a bounded buffer, not the
// file (ReadFile grew a buffer to the file's size up front, and WriteFile
// took the whole file as one []byte); a failing source leaves the old
// file and no temporary one.
func TestFilesStream(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "streamed", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	f, err := os.Create(filepath.Join(home, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 1000 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var n int64
	alloc := allocDuring(func() {
		rc, sz, err := p.OpenFile(ctx, h, "/home/sprite/sparse")
		if err != nil {
			t.Fatal(err)
		}
		if sz != size {
			t.Errorf("size %d", sz)
		}
		n, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, make([]byte, 64<<10))
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	})
	if n != size || alloc > 4<<20 {
		t.Errorf("OpenFile: %d bytes read, %d bytes allocated (want < 4 MiB)", n, alloc)
	}
	alloc = allocDuring(func() {
		if err := p.WriteFileFrom(ctx, h, "written", io.LimitReader(zeros{}, 256<<20), sandbox.WriteFileOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if st, err := os.Stat(filepath.Join(home, "written")); err != nil || st.Size() != 256<<20 || alloc > 4<<20 {
		t.Errorf("WriteFileFrom: %v %v, %d bytes allocated (want < 4 MiB)", st, err, alloc)
	}
	broken := errors.New("client gone")
	err = p.WriteFileFrom(ctx, h, "written", io.MultiReader(strings.NewReader("partial"), errReader{broken}), sandbox.WriteFileOptions{})
	if !errors.Is(err, broken) {
		t.Errorf("a failing source: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(home, "written")); st == nil || st.Size() != 256<<20 {
		t.Errorf("a failed write changed the old file: %v", st)
	}
	ents, _ := os.ReadDir(home)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".managoat-write-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestExportTree: the host writes the tar of a home directory itself:
// files with their contents and permission bits (set-id dropped),
// symlinks as links, a fifo left out; a path outside the home is
// ErrNotSupported with nothing written.
func TestExportTree(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "exported", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := p.HostPath(h, "/home/sprite")
	for _, d := range []string{"tree", "tree/sub"} {
		if err := os.Mkdir(filepath.Join(home, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(home, "tree/sub/f"), []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "tree/suid"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(home, "tree/suid"), 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	_ = os.Symlink("/etc/passwd", filepath.Join(home, "tree/out"))
	_ = unix.Mkfifo(filepath.Join(home, "tree/fifo"), 0o644)
	var b bytes.Buffer
	if err := p.ExportTree(ctx, h, "/home/sprite/tree", &b); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	tr := tar.NewReader(&b)
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		body, _ := io.ReadAll(tr)
		got[hdr.Name] = fmt.Sprintf("%c %o %s%s", hdr.Typeflag, hdr.Mode, body, hdr.Linkname)
	}
	want := map[string]string{"tree/": "5 750 ", "tree/sub/": "5 750 ", "tree/sub/f": "0 640 hello",
		"tree/suid": "0 755 x", "tree/out": "2 777 /etc/passwd"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("exported\n%v\nwant\n%v", got, want)
	}
	_ = os.Symlink("/tmp", filepath.Join(home, "tmplink"))
	for _, outside := range []string{"/etc", "/tmp/x", "/home/sprite/../../etc", "/home/sprite/tmplink/x"} {
		b.Reset()
		if err := p.ExportTree(ctx, h, outside, &b); !errors.Is(err, sandbox.ErrNotSupported) || b.Len() != 0 {
			t.Errorf("%s: %v, %d bytes written", outside, err, b.Len())
		}
	}
	if err := p.ExportTree(ctx, h, "/home/sprite/nope", &b); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a missing path: %v", err)
	}
}
