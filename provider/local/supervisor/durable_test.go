package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/local/journal"
)

// envAtomicWriter makes the test binary a writer that replaces the file it
// names with writeFileAtomic in a loop until it is killed.
const envAtomicWriter = "MANAGOAT_TEST_ATOMIC_WRITER"

// stateContent is a self-checking state file: its length, the SHA-256 of
// the payload, the payload.
func stateContent(seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	payload := make([]byte, 1+rng.IntN(256<<10))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	sum := sha256.Sum256(payload)
	b := binary.BigEndian.AppendUint64(nil, uint64(len(payload)))
	b = append(b, sum[:]...)
	return append(b, payload...)
}

func checkStateContent(b []byte) error {
	if len(b) < 40 {
		return fmt.Errorf("%d bytes: shorter than a header", len(b))
	}
	n := binary.BigEndian.Uint64(b)
	if uint64(len(b)-40) != n {
		return fmt.Errorf("%d bytes of payload, header says %d", len(b)-40, n)
	}
	if sha256.Sum256(b[40:]) != [32]byte(b[8:40]) {
		return errors.New("payload does not match its hash")
	}
	return nil
}

func maybeAtomicWriter() {
	path := os.Getenv(envAtomicWriter)
	if path == "" {
		return
	}
	for i := uint64(rand.Uint32()); ; i++ {
		if err := writeFileAtomic(path, stateContent(i)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if i%4 == 0 {
			os.Stdout.Write([]byte{'.'}) // alive; the parent reads the first
		}
	}
}

// TestAtomicStateWriteUnderKill kills a process replacing a state file
// (writeFileAtomic) with SIGKILL at random points, again and again, and
// checks after each kill that the file is absent (killed before its first
// rename) or one whole version, never a torn or empty one, and that at
// most the one temporary file is left beside it.
func TestAtomicStateWriteUnderKill(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second) // a bound on the test, not an assertion
	rounds, whole, tornTemps := 0, 0, 0
	for rounds < 200 && time.Now().Before(deadline) {
		rounds++
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), envAtomicWriter+"="+path)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		alive, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if rounds%2 == 0 { // half the kills once writes are under way, half from the start
			if _, err := alive.Read(make([]byte, 1)); err != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("writer: %v %s", err, stderr.String())
			}
		}
		time.Sleep(time.Duration(rand.IntN(30_000)) * time.Microsecond) // a random point to kill at
		_ = cmd.Process.Kill()
		if err := cmd.Wait(); err == nil || stderr.Len() > 0 {
			t.Fatalf("writer: %v %s", err, stderr.String())
		}
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			t.Fatal(err)
		default:
			if err := checkStateContent(b); err != nil {
				t.Fatalf("round %d: the state file is torn: %v", rounds, err)
			}
			whole++
		}
		if tb, err := os.ReadFile(path + ".tmp"); err == nil && checkStateContent(tb) != nil {
			tornTemps++
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) > 2 {
			t.Fatalf("round %d: %d files left in the directory", rounds, len(ents))
		}
	}
	if whole == 0 {
		t.Fatalf("%d rounds and no write ever completed", rounds)
	}
	t.Logf("%d kills: the file whole after %d, a torn temporary beside it after %d", rounds, whole, tornTemps)
}

// ext4Shutdown is EXT4_IOC_SHUTDOWN; with ext4GoingNoLogFlush the
// filesystem stops where it is, as at a power cut: nothing more of the
// page cache or of ext4's own journal reaches the disk (xfstests' godown).
const (
	ext4Shutdown        = 0x8004587D
	ext4GoingNoLogFlush = 2
)

// crashFS mounts a fresh ext4 image on a loop device at a temporary
// directory and returns it with a function that crashes the filesystem
// (shutdown without flushing), unmounts it and mounts the image again.
func crashFS(t *testing.T) (string, func(kill func())) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.ext4")
	testenv.Require(t, err == nil, "mkfs.ext4 (e2fsprogs)")
	_, err = os.Stat("/dev/loop-control")
	testenv.Require(t, err == nil, "loop devices (/dev/loop-control)")
	base := t.TempDir()
	img, mnt := filepath.Join(base, "img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("truncate", "-s", "256M", img); err != nil {
		t.Fatal(err)
	}
	if err := run("mkfs.ext4", "-q", img); err != nil {
		t.Fatal(err)
	}
	err = run("mount", "-o", "loop", img, mnt)
	testenv.Require(t, err == nil, fmt.Sprintf("mount an ext4 image on a loop device: %v", err))
	mounted := true
	t.Cleanup(func() {
		if !mounted {
			return
		}
		for i := 0; i < 500; i++ { // until a supervisor that was told to go has gone
			if run("umount", mnt) == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		_ = run("umount", "-l", mnt)
	})
	crash := func(kill func()) {
		t.Helper()
		d, err := os.Open(mnt)
		if err != nil {
			t.Fatal(err)
		}
		flag := uint32(ext4GoingNoLogFlush)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4Shutdown, uintptr(unsafePointer(&flag)))
		d.Close()
		testenv.Require(t, errno == 0, fmt.Sprintf("ext4 shutdown ioctl: %v", errno))
		kill() // whatever holds files there
		var uerr error
		for i := 0; i < 500; i++ { // until the killed processes closed their files
			if uerr = run("umount", mnt); uerr == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if uerr != nil {
			mounted = false
			_ = run("umount", "-l", mnt)
			t.Fatal(uerr)
		}
		if err := run("mount", "-o", "loop", img, mnt); err != nil {
			mounted = false
			t.Fatal(err)
		}
	}
	return mnt, crash
}

// TestStateSurvivesCrash: a host crash (the filesystem shut down with no
// flush, then mounted again, as after a reboot) keeps what the supervisor
// said was there: an exited session's meta.json, its whole journal and
// its exit mark; a running session's meta.json and, after a suspend (a
// checkpoint), its journal up to the suspend; the suspended marker. A
// supervisor started on the remounted directory then marks the running
// session lost. Without the syncs (writeFileAtomic's, the journal's at the
// exit and at the suspend) the files come back empty or gone.
func TestStateSurvivesCrash(t *testing.T) {
	mnt, crash := crashFS(t)
	dir := filepath.Join(mnt, "sbx")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := Launch(ctx, dir); err != nil {
		t.Fatal(err)
	}
	c := Client{Dir: dir}
	supPid, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var seq strings.Builder
	for i := 1; i <= 100000; i++ {
		seq.WriteString(strconv.Itoa(i) + "\n")
	}
	done, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "seq 1 100000; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	if o, err := c.Follow(ctx, done, col.emit); err != nil || !o.Exited || o.Code != 3 || col.out.String() != seq.String() {
		t.Fatalf("follow: %+v %v, %d bytes", o, err, col.out.Len())
	}
	for { // the exit mark follows the exit record
		if st, _ := SessionState(dir, done); st == "exited" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	running, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "echo before-suspend; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	for { // its output is journaled
		b, _ := os.ReadFile(JournalPath(dir, running))
		if bytes.Contains(b, []byte("before-suspend\n")) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	ss, err := ReadSessions(dir)
	if err != nil || len(ss) != 2 {
		t.Fatalf("sessions %+v %v", ss, err)
	}
	crash(func() {
		_ = syscall.Kill(-ss[1].Pid, syscall.SIGKILL)
		_ = syscall.Kill(supPid, syscall.SIGKILL)
	})

	after, err := ReadSessions(dir)
	if err != nil || len(after) != 2 || after[0].ID != done || after[1].ID != running {
		t.Fatalf("after the crash, sessions %+v %v", after, err)
	}
	if st, code := SessionState(dir, done); st != "exited" || code != 3 {
		t.Fatalf("after the crash, %s is %s %d", done, st, code)
	}
	read := func(id string) (string, *journal.Record) {
		r, err := journal.Open(JournalPath(dir, id))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var out strings.Builder
		var exit *journal.Record
		if _, err := r.Read(-1, func(rec journal.Record) error {
			if rec.Kind == journal.KindExit {
				exit = &rec
			} else {
				out.Write(rec.Data)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out.String(), exit
	}
	if out, exit := read(done); out != seq.String() || exit == nil || exit.Code != 3 {
		t.Fatalf("after the crash, %s's journal holds %d bytes of %d, exit %+v", done, len(out), seq.Len(), exit)
	}
	if out, exit := read(running); out != "before-suspend\n" || exit != nil {
		t.Fatalf("after the crash, %s's journal holds %q, exit %+v", running, out, exit)
	}
	if b, err := os.ReadFile(filepath.Join(dir, SuspendedName)); err != nil || len(b) == 0 {
		t.Fatalf("after the crash, the suspended marker: %q %v", b, err)
	}

	// A supervisor restarted on it marks the session it cannot own lost.
	if err := Launch(ctx, dir); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Shutdown(context.Background(), true) }()
	if st, _ := SessionState(dir, running); st != "lost" {
		t.Fatalf("after the restart, %s is %s", running, st)
	}
}

func unsafePointer(p *uint32) unsafe.Pointer { return unsafe.Pointer(p) }
