package jail_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

func TestStartProcess(t *testing.T) {
	j := newJail(t)
	started(t, j, "sp", mechanism.Spec{})
	ctx := context.Background()
	var out, errb bytes.Buffer
	p, err := j.StartProcess(ctx, "sp", mechanism.ProcessSpec{
		Argv:  []string{"sh", "-c", "cat; echo done >&2; exit 3"},
		Stdin: strings.NewReader("hello from stdin\n"), Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st.Code != 3 || out.String() != "hello from stdin\n" || errb.String() != "done\n" {
		t.Fatalf("wait = %+v, %v; out %q err %q", st, err, out.String(), errb.String())
	}
	// A long-lived process: its host pid is in another pid namespace, and
	// Signal ends it.
	p, err = j.StartProcess(ctx, "sp", mechanism.ProcessSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 200 && pid == 0; i++ {
		pid = p.Pid()
		if pid == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if pid <= 0 {
		t.Fatal("no host pid")
	}
	mine, _ := os.Readlink("/proc/self/ns/pid")
	theirs, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if theirs == "" || theirs == mine {
		t.Errorf("process %d shares the host pid namespace (%s)", pid, theirs)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st, _ = p.Wait()
	if st.Signal != syscall.SIGKILL {
		t.Errorf("after SIGKILL: %+v", st)
	}
	if _, err := j.StartProcess(ctx, "sp", mechanism.ProcessSpec{Argv: []string{"no-such-binary"}}); !errors.Is(err, mechanism.ErrCouldNotRun) {
		t.Errorf("missing binary: %v", err)
	}
}

// TestManagerRestart: a second Jail on the same state directory (the
// managing process restarted) sees, uses and stops the sandbox.
func TestManagerRestart(t *testing.T) {
	testenvRoot(t)
	dir := t.TempDir()
	j1, _ := jail.New(jail.Config{StateDir: dir})
	started(t, j1, "keep", mechanism.Spec{})
	j2, err := jail.New(jail.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s, _ := j2.Status(ctx, "keep"); s != mechanism.StatusRunning {
		t.Fatalf("status from a new manager = %s", s)
	}
	if l, _ := j2.ListRunning(ctx); !slices.Equal(l, []string{"keep"}) {
		t.Fatalf("ListRunning from a new manager = %v", l)
	}
	if c, err := j2.Execute(ctx, "keep", []string{"echo", "hi"}, mechanism.ExecOptions{}); err != nil || string(c.Stdout) != "hi\n" {
		t.Fatalf("execute from a new manager: %+v %v", c, err)
	}
	if err := j2.Stop(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	if s, _ := j1.Status(ctx, "keep"); s != mechanism.StatusStopped {
		t.Fatalf("status after the other manager stopped it = %s", s)
	}
}

// TestInitKilledFromHost: a sandbox whose init dies is not running; with
// either init, every thread of it carries the restrictions.
func TestInitKilledFromHost(t *testing.T) {
	for _, mode := range jail.InitModes() {
		t.Run(mode, func(t *testing.T) {
			t.Setenv(jail.InitEnv, mode)
			initKilledFromHost(t, mode)
		})
	}
}

func initKilledFromHost(t *testing.T, mode string) {
	testenvRoot(t)
	dir := t.TempDir()
	j, _ := jail.New(jail.Config{StateDir: dir})
	started(t, j, "k", mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 128 << 20}})
	b, _ := os.ReadFile(filepath.Join(dir, "k", "state.json"))
	var st struct {
		InitPid int    `json:"initPid"`
		Cgroup  string `json:"cgroup"`
	}
	json.Unmarshal(b, &st)
	// Every thread of the init carries the restrictions, not only the one
	// that applied them.
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(st.InitPid) + "/task")
	if n := len(tasks); (mode != "go" && n != 1) || (mode == "go" && n < 2) {
		t.Fatalf("the %s init has %d threads", mode, n)
	}
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(st.InitPid) + "/task/" + task.Name() + "/status")
		for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t00000000000000e0", "CapBnd:\t00000000000000e0"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("init thread %s lacks %q", task.Name(), want)
			}
		}
	}
	if err := syscall.Kill(st.InitPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := j.Status(ctx, "k")
		if s == mechanism.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after the init was killed = %s", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := j.Execute(ctx, "k", []string{"true"}, mechanism.ExecOptions{}); !errors.Is(err, mechanism.ErrCouldNotRun) {
		t.Fatalf("execute in a dead sandbox: %v", err)
	}
	// Start again reuses the same id and files.
	if err := j.Start(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := j.Destroy(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/sys/fs/cgroup/pids/" + st.Cgroup, "/sys/fs/cgroup/unified/" + st.Cgroup} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup left behind: %s", d)
		}
	}
}

func TestRefusals(t *testing.T) {
	j := newJail(t)
	ctx := context.Background()
	var u *mechanism.UnavailableError
	err := j.Provision(ctx, "d", mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 1 << 30}})
	if m, why := j.DiskQuotaMethod(); m != "" {
		// Bounded here (quota.go, TestDiskQuota*), not refused.
		if err != nil {
			t.Fatalf("disk quota with %s (%s): %v", m, why, err)
		}
		if err := j.Destroy(ctx, "d"); err != nil {
			t.Fatal(err)
		}
	} else if !errors.As(err, &u) || u.Missing[0].Name != mechanism.DiskQuota {
		t.Fatalf("disk quota: %v", err)
	}
	err = j.Provision(ctx, "e", mechanism.Spec{Egress: []string{"not a domain!"}})
	if !errors.Is(err, mechanism.ErrInvalid) || !strings.Contains(err.Error(), "not a domain!") {
		t.Fatalf("bad egress entry: %v", err)
	}
	if s, _ := j.Status(ctx, "d"); s != mechanism.StatusAbsent {
		t.Fatalf("a refused provision left %s", s)
	}
	for _, id := range []string{"../x", "a/b", ""} {
		if err := j.Provision(ctx, id, mechanism.Spec{}); !errors.Is(err, mechanism.ErrInvalid) {
			t.Errorf("id %q: %v", id, err)
		}
	}
	started(t, j, "ok", mechanism.Spec{})
	if _, err := j.HostPath("ok", "/home/sprite/../../etc/passwd"); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("escaping path: %v", err)
	}
	if p, err := j.HostPath("ok", "/home/sprite/f.txt"); err != nil {
		t.Fatal(err)
	} else {
		if err := os.WriteFile(p, []byte("from host"), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := j.Execute(ctx, "ok", []string{"cat", "f.txt"}, mechanism.ExecOptions{})
		if err != nil || string(c.Stdout) != "from host" {
			t.Fatalf("file written through HostPath: %q %v", c.Stdout, err)
		}
	}
	if err := j.UpdateEgress(ctx, "ok", nil); err != nil {
		t.Errorf("deny-all egress update: %v", err)
	}
	if err := j.UpdateEgress(ctx, "ok", []string{"1.1.1.1:443"}); err != nil {
		t.Errorf("allowlist egress update: %v", err)
	}
	started(t, j, "none", mechanism.Spec{Network: mechanism.NetworkNone})
	if err := j.UpdateEgress(ctx, "none", nil); err != nil {
		t.Errorf("deny-all egress update of a sandbox without network: %v", err)
	}
	if err := j.UpdateEgress(ctx, "none", []string{"1.1.1.1:443"}); !errors.Is(err, mechanism.ErrCapabilityUnavailable) {
		t.Errorf("allowlist egress update of a sandbox without network: %v", err)
	}
	if err := j.Provision(ctx, "ok", mechanism.Spec{Limits: mechanism.Limits{Pids: 5}}); !errors.Is(err, mechanism.ErrExists) {
		t.Errorf("reprovision with another spec: %v", err)
	}
}

// TestStartFailsCleanly: a start that fails half way (the home directory
// vanished after provision) reports the error, leaves the sandbox not
// running, and leaves no goroutine behind (goleak in TestMain) nor a
// cgroup; the next start after the home is back works.
func TestStartFailsCleanly(t *testing.T) {
	j := newJail(t)
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "h")
	if err := j.Provision(ctx, "f", mechanism.Spec{HomeDir: home}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), "f") })
	if err := os.Remove(home); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "f"); err == nil {
		t.Fatal("start without a home directory succeeded")
	}
	if s, _ := j.Status(ctx, "f"); s == mechanism.StatusRunning {
		t.Fatalf("status after a failed start = %s", s)
	}
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "f"); err != nil {
		t.Fatalf("start once the home is back: %v", err)
	}
	if c, err := j.Execute(ctx, "f", []string{"true"}, mechanism.ExecOptions{}); err != nil || c.ExitStatus != 0 {
		t.Fatalf("execute after a failed then good start: %+v %v", c, err)
	}
}
