package e2b_test

import (
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

func TestSmoke(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("smoke-1")
	res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "bash", Args: []string{"-lc", "echo hello; echo oops >&2; exit 3"}}, sandbox.ExecOptions{StderrToStdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || !strings.Contains(string(res.Output), "hello") || !strings.Contains(string(res.Output), "oops") {
		t.Fatalf("got %q %d", res.Output, res.ExitCode)
	}
	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-c.Events()
	if ev.Kind != sandbox.Stdout || string(ev.Data) != "ready\n" {
		t.Fatalf("first event %+v", ev)
	}
	ss, err := e.p.ListSessions(ctx(t), h)
	if err != nil || len(ss) != 1 {
		t.Fatalf("sessions %v %v", ss, err)
	}
	if ss[0].Command != "sh -c echo ready; exec cat" {
		t.Fatalf("session command %q", ss[0].Command)
	}
	a, err := e.p.Attach(ctx(t), h, ss[0].ID, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	ev = <-a.Events()
	if ev.Kind != sandbox.Stdout || string(ev.Data) != "ready\n" {
		t.Fatalf("replayed %+v", ev)
	}
	if err := c.WriteStdin(ctx(t), []byte("ping")); err != nil {
		t.Fatal(err)
	}
	ev = <-c.Events()
	if string(ev.Data) != "ping" {
		t.Fatalf("echo %+v", ev)
	}
	ev = <-a.Events()
	if string(ev.Data) != "ping" {
		t.Fatalf("tailed %+v", ev)
	}
	if err := a.CloseStdin(ctx(t)); err != nil {
		t.Fatal(err)
	}
	out, _, term := collect(t, c, 5*time.Second)
	if out != "" || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("spawn end %q %+v", out, term)
	}
	out, _, term = collect(t, a, 5*time.Second)
	if out != "" || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("attach end %q %+v", out, term)
	}
}
