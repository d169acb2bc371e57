package supervisor

import (
	"bytes"
	"context"
	"errors"
	"github.com/managoat/managoat/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/local/journal"
)

// plainBackend runs sessions as plain host processes in the sandbox dir.
type plainBackend struct{ dir string }

type plainProc struct{ cmd *exec.Cmd }

func (p plainProc) Pid() int { return p.cmd.Process.Pid }
func (p plainProc) Signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}
func (p plainProc) Wait() (int, int, error) {
	err := p.cmd.Wait()
	st, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && st.Signaled() {
		return 128 + int(st.Signal()), int(st.Signal()), nil
	}
	if p.cmd.ProcessState != nil {
		return p.cmd.ProcessState.ExitCode(), 0, nil
	}
	return -1, 0, err
}

func (b plainBackend) Start(context.Context) error { return nil }
func (b plainBackend) StartProcess(_ context.Context, s ProcessSpec) (Process, error) {
	name := s.Argv[0]
	if !strings.Contains(name, "/") {
		for _, d := range []string{"/usr/bin", "/bin"} {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				name = filepath.Join(d, name)
				break
			}
		}
	}
	cmd := exec.Command(name, s.Argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, s.Env...)
	cmd.Dir = s.Dir
	if s.Stdin != nil {
		cmd.Stdin = s.Stdin
	}
	cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(ErrCouldNotRun, err)
	}
	return plainProc{cmd}, nil
}
func (b plainBackend) UpdateEgress(context.Context, []string) error { return ErrNotSupported }
func (b plainBackend) Stop(context.Context) error                   { return nil }
func (b plainBackend) Destroy(context.Context) error                { return nil }

func TestMain(m *testing.M) {
	maybeAtomicWriter() // durable_test.go
	MaybeRun(func(dir string) (Backend, error) { return plainBackend{dir}, nil })
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

func newSandbox(t *testing.T) Client {
	t.Helper()
	dir := t.TempDir()
	if err := Launch(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	c := Client{Dir: dir}
	t.Cleanup(func() { _ = c.Shutdown(context.Background(), true) })
	return c
}

type collected struct {
	mu  sync.Mutex
	out bytes.Buffer
	err bytes.Buffer
	n   int
}

func (c *collected) emit(r journal.Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if r.Kind == journal.KindStdout {
		c.out.Write(r.Data)
	} else {
		c.err.Write(r.Data)
	}
	return true
}

func TestSpawnFollow(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	o, err := c.Follow(ctx, id, col.emit)
	if err != nil || !o.Exited || o.Code != 7 {
		t.Fatalf("outcome %+v, %v", o, err)
	}
	if col.out.String() != "out\n" || col.err.String() != "err\n" {
		t.Fatalf("out %q err %q", col.out.String(), col.err.String())
	}
	ss, _ := ReadSessions(c.Dir)
	if len(ss) != 1 || ss[0].ID != id || ss[0].Command != "sh -c echo out; echo err >&2; exit 7" {
		t.Fatalf("sessions %+v", ss)
	}
	if _, err := c.Follow(ctx, "nope", col.emit); err == nil {
		t.Fatal("follow of an unknown session succeeded")
	}
}

func TestStdinAndAttachers(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "echo ready; exec cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	cols := make([]*collected, n)
	var wg sync.WaitGroup
	for i := range cols {
		cols[i] = &collected{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := c.Follow(ctx, id, cols[i].emit)
			if err != nil || !o.Exited || o.Code != 0 {
				t.Errorf("outcome %+v %v", o, err)
			}
		}()
	}
	for i := 0; i < 50; i++ {
		if err := c.WriteStdin(ctx, id, []byte("line\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseStdin(ctx, id); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	want := "ready\n" + strings.Repeat("line\n", 50)
	for i, col := range cols {
		if col.out.String() != want {
			t.Fatalf("attacher %d got %q", i, col.out.String())
		}
	}
	var se *Error
	if err := c.WriteStdin(ctx, id, []byte("late")); !errors.As(err, &se) || se.Code != CodeExited {
		t.Fatalf("late write: %v", err)
	}
}

func TestTerminate(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	done := make(chan Outcome, 1)
	ready := make(chan struct{})
	var once sync.Once
	go func() {
		o, _ := c.Follow(ctx, id, func(r journal.Record) bool {
			once.Do(func() { close(ready) })
			return col.emit(r)
		})
		done <- o
	}()
	<-ready // the trap is set
	start := time.Now()
	if err := c.Terminate(ctx, id, false, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("SIGTERM-ignoring session ended before the grace")
	}
	o := <-done
	if !o.Exited || o.Code != 137 {
		t.Fatalf("outcome %+v", o)
	}
	if err := c.Terminate(ctx, id, true, 0); err != nil {
		t.Fatalf("second terminate: %v", err)
	}
}

// kill -9 of the supervisor loses no journal byte already written; the
// session reads as lost, never as an exit.
func TestSupervisorKilled(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if err := Launch(ctx, dir); err != nil {
		t.Fatal(err)
	}
	c := Client{Dir: dir}
	pid, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 1000 ]; do echo line$i; i=$((i+1)); done; exec sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(col.out.String(), "line999\n") {
		if time.Now().After(deadline) {
			t.Fatal("no output")
		}
		col = collected{}
		fctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		c.Follow(fctx, id, col.emit)
		cancel()
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for time.Now().Before(deadline) {
		if _, err := c.Ping(ctx); errors.Is(err, ErrNoSupervisor) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var after collected
	o, err := c.Follow(ctx, id, after.emit)
	if err != nil || !o.Lost || o.Exited {
		t.Fatalf("outcome %+v, %v", o, err)
	}
	if after.out.String() != col.out.String() {
		t.Fatalf("journal lost bytes: %d vs %d", after.out.Len(), col.out.Len())
	}
	// A new supervisor reaps the orphan and serves the old journal.
	if err := Launch(ctx, dir); err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(ctx, true)
	var again collected
	if o, err := c.Follow(ctx, id, again.emit); err != nil || !o.Lost || again.out.String() != col.out.String() {
		t.Fatalf("after restart %+v %v", o, err)
	}
	if err := c.Terminate(ctx, id, false, time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestDirRemovedSupervisorExits(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sbx")
	os.Mkdir(dir, 0o700)
	ctx := context.Background()
	if err := Launch(ctx, dir); err != nil {
		t.Fatal(err)
	}
	pid, _ := Client{Dir: dir}.Ping(ctx)
	// Removed as rm -r does (a rename away is not watched: Destroy tells
	// the supervisor).
	os.RemoveAll(dir)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("supervisor did not exit after its directory was removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Without setsid(1) on PATH, the binary's own first stage detaches the
// supervisor.
func TestLaunchWithoutSetsid(t *testing.T) {
	t.Setenv("PATH", "/nonexistent")
	c := newSandbox(t)
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	var col collected
	if o, err := c.Follow(ctx, id, col.emit); err != nil || !o.Exited || col.out.String() != "hi\n" {
		t.Fatalf("%+v %v %q", o, err, col.out.String())
	}
}

// A lone small write reaches a follower while the command still runs: no
// batching waits for more output or for the exit.
func TestLoneWriteDelivered(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "echo one; exec cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 16)
	done := make(chan Outcome, 1)
	go func() {
		o, _ := c.Follow(ctx, id, func(r journal.Record) bool {
			got <- string(r.Data)
			return true
		})
		done <- o
	}()
	// The bound only keeps a broken build from hanging the suite.
	wait := func(want string) {
		t.Helper()
		var seen string
		deadline := time.After(20 * time.Second)
		for seen != want {
			select {
			case s := <-got:
				seen += s
			case <-deadline:
				t.Fatalf("follower saw %q, want %q before any more output", seen, want)
			}
		}
	}
	wait("one\n")
	if err := c.WriteStdin(ctx, id, []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	wait("two\n")
	if err := c.CloseStdin(ctx, id); err != nil {
		t.Fatal(err)
	}
	if o := <-done; !o.Exited || o.Code != 0 {
		t.Fatalf("outcome %+v", o)
	}
}

// Output much larger than the pipes (the batches go through the staging
// pipe) reaches every follower whole and in order, stdout and stderr each.
func TestLargeOutput(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	const lines = 300000
	id, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "seq 1 300000; seq 1 1000 >&2; head -c 3000000 /dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	var want, wantErr bytes.Buffer
	for i := 1; i <= lines; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	for i := 1; i <= 1000; i++ {
		wantErr.WriteString(strconv.Itoa(i) + "\n")
	}
	want.Write(make([]byte, 3000000))
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var col collected
			o, err := c.Follow(ctx, id, col.emit)
			if err != nil || !o.Exited || o.Code != 0 {
				t.Errorf("outcome %+v %v", o, err)
				return
			}
			if !bytes.Equal(col.out.Bytes(), want.Bytes()) || !bytes.Equal(col.err.Bytes(), wantErr.Bytes()) {
				t.Errorf("got %d stdout bytes, %d stderr bytes; want %d, %d (or different bytes)",
					col.out.Len(), col.err.Len(), want.Len(), wantErr.Len())
			}
		}()
	}
	wg.Wait()
}
