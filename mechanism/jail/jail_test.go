package jail_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

func newJail(t testing.TB) *jail.Jail {
	t.Helper()
	testenv.RequireRoot(t)
	j, err := jail.New(jail.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func started(t testing.TB, j *jail.Jail, id string, spec mechanism.Spec) {
	t.Helper()
	ctx := context.Background()
	if err := j.Provision(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := j.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	if err := j.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, j *jail.Jail, id string, script string) mechanism.Completion {
	t.Helper()
	c, err := j.Execute(context.Background(), id, []string{"/bin/sh", "-c", script}, mechanism.ExecOptions{})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return c
}

func TestLifecycle(t *testing.T) {
	j := newJail(t)
	ctx := context.Background()
	if s, _ := j.Status(ctx, "a"); s != mechanism.StatusAbsent {
		t.Fatalf("status before provision = %s", s)
	}
	started(t, j, "a", mechanism.Spec{})
	if s, _ := j.Status(ctx, "a"); s != mechanism.StatusRunning {
		t.Fatalf("status after start = %s", s)
	}
	c := run(t, j, "a", "id -u; hostname; cat /proc/self/status | grep -E '^(Cap|NoNewPrivs|Seccomp)'; ls /; echo $HOME; pwd; echo err >&2; exit 7")
	t.Logf("stdout:\n%s\nstderr: %s", c.Stdout, c.Stderr)
	if c.ExitStatus != 7 || !strings.HasPrefix(string(c.Stdout), "1000\n") || string(c.Stderr) != "err\n" {
		t.Fatalf("completion = %+v", c)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(string(c.Stdout), want) {
			t.Errorf("missing %q", want)
		}
	}
	l, _ := j.ListRunning(ctx)
	if len(l) != 1 || l[0] != "a" {
		t.Fatalf("ListRunning = %v", l)
	}
	if err := j.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if s, _ := j.Status(ctx, "a"); s != mechanism.StatusStopped {
		t.Fatalf("status after stop = %s", s)
	}
	if _, err := j.Execute(ctx, "a", []string{"true"}, mechanism.ExecOptions{}); !errors.Is(err, mechanism.ErrCouldNotRun) {
		t.Fatalf("execute on stopped = %v", err)
	}
	if err := j.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	run(t, j, "a", "true")
	if err := j.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := j.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if s, _ := j.Status(ctx, "a"); s != mechanism.StatusAbsent {
		t.Fatalf("status after destroy = %s", s)
	}
	_ = os.Getpid
	_ = time.Now
}

func testenvRoot(t *testing.T) { t.Helper(); testenv.RequireRoot(t) }
