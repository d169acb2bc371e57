package fake_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func cmd(args ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: args} }

// Fixtures are the fake's conformance fixtures.
var Fixtures = sandboxtest.Fixtures{
	ExecOK: cmd("out:hello"), ExecOKWant: "hello",
	ExecFail: cmd("out:oops", "exit:3"), ExecFailCode: 3,
	SpawnOK:   cmd("out:hello", "exit:0"),
	SpawnDrop: cmd("out:partial", "drop"),
	SpawnStay: cmd("out:ready", "stay"),
	Stderr:    cmd("out:x", "err:warning"), StderrWant: "warning",
	EnvDir:  cmd("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
	Slow:    cmd("out:tick", "sleep:10s", "out:done"),
	Connect: func(addr string) sandbox.Cmd { return cmd("connect:" + addr) },
}

func TestConformance(t *testing.T) {
	p := fake.New()
	t.Cleanup(func() { _ = p.Close() })
	sandboxtest.Run(t, p, Fixtures, sandboxtest.WithTimeout(2*time.Second))
}

func setup(t *testing.T) (*fake.Provider, *sandbox.Registry, *sandbox.Handle, context.Context) {
	p := fake.New()
	t.Cleanup(func() { _ = p.Close() })
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()
	h, err := reg.Create(ctx, fake.Name, "worker", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p, reg, h, ctx
}

func drain(t *testing.T, c *sandbox.Command) (out []string, term sandbox.Event) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return out, term
			}
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
				out = append(out, ev.Kind.String()+":"+string(ev.Data))
			default:
				term = ev
			}
		case <-timeout:
			t.Fatal("command did not finish")
		}
	}
}

func TestPolicyRecordedVerbatim(t *testing.T) {
	p, reg, h, ctx := setup(t)
	if err := reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatal(err)
	}
	if got := p.Policy("worker"); got == nil || got.Allow == nil || len(got.Allow) != 0 {
		t.Fatalf("policy = %+v, want an empty (deny-all) allow list", got)
	}
	_ = reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"a.example", "b.example"}})
	if got := p.Policy("worker"); !slices.Equal(got.Allow, []string{"a.example", "b.example"}) {
		t.Fatalf("policy = %+v", got)
	}
}

func TestWriteFileStoresBytes(t *testing.T) {
	p, reg, h, ctx := setup(t)
	if err := reg.WriteFile(ctx, h, "/work/f", []byte("data"), sandbox.WriteFileOptions{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if got := string(p.File("worker", "/work/f")); got != "data" {
		t.Fatalf("file = %q", got)
	}
}

func TestExecDropsStderrAndAutoExits(t *testing.T) {
	_, reg, h, ctx := setup(t)
	res, err := reg.Exec(ctx, h, cmd("out:out", "err:noise"), sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "out" || res.ExitCode != 0 {
		t.Fatalf("Exec = %q %d %v", res.Output, res.ExitCode, err)
	}
	res, err = reg.Exec(ctx, h, cmd("out:a", "exit:4", "out:b", "exit:5"), sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "ab" || res.ExitCode != 4 {
		t.Fatalf("first exit wins: Exec = %q %d %v", res.Output, res.ExitCode, err)
	}
	if _, err := reg.Exec(ctx, h, cmd("bogus"), sandbox.ExecOptions{}); err == nil {
		t.Fatal("unknown instruction accepted")
	}
}

func TestStderrOnlyScriptAutoExitsAndReplays(t *testing.T) {
	_, reg, h, ctx := setup(t)
	c, err := reg.Spawn(ctx, h, cmd("err:warning"), sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, term := drain(t, c)
	if !slices.Equal(out, []string{"stderr:warning"}) || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("events %v %v", out, term)
	}
	ss, _ := reg.ListSessions(ctx, h)
	a, err := reg.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, term = drain(t, a)
	if !slices.Equal(out, []string{"stderr:warning"}) || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("replay %v %v", out, term)
	}
}

func TestTerminationSemantics(t *testing.T) {
	_, reg, h, ctx := setup(t)
	c, err := reg.Spawn(ctx, h, cmd("out:ready", "stay"), sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-c.Events(); string(ev.Data) != "ready" {
		t.Fatalf("first event %v", ev)
	}
	ss, _ := reg.ListSessions(ctx, h)
	if ss[0].Command != "emit out:ready stay" {
		t.Fatalf("session command %q", ss[0].Command)
	}
	_ = c.Stop()
	if err := c.WriteStdin(ctx, []byte("x")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("write after detach = %v", err)
	}
	a, _ := reg.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{})
	if err := reg.TerminateSession(ctx, sandbox.BuildHandle(fake.Name, "other"), ss[0].ID, sandbox.TerminateOptions{}); err != nil {
		t.Fatalf("terminate on another sandbox = %v", err)
	}
	if err := reg.TerminateSession(ctx, h, ss[0].ID, sandbox.TerminateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, term := drain(t, a)
	if !slices.Equal(out, []string{"stdout:ready"}) || term.Kind != sandbox.Exit || term.Code != 137 {
		t.Fatalf("attacher saw %v %v, want ready then exit 137", out, term)
	}
	if err := reg.TerminateSession(ctx, h, "absent", sandbox.TerminateOptions{Mode: sandbox.Force}); !sandbox.Transient(err) {
		t.Fatalf("force on absent = %v, want termination_unconfirmed", err)
	}
	if err := reg.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestMissingSandbox(t *testing.T) {
	_, reg, _, ctx := setup(t)
	h := sandbox.BuildHandle(fake.Name, "missing")
	if _, err := reg.PublicURL(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("PublicURL = %v", err)
	}
	if err := reg.Suspend(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Suspend = %v", err)
	}
}
