package daytona_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/managoat/managoat/provider/daytona/daytonatest"
	"github.com/managoat/managoat/sandbox"
)

// WriteStdin, CloseStdin and a spawned command's output stream meet the
// toolbox proxy's refusal (401, apps/proxy pkg/proxy/auth.go) once the
// sandbox is deleted under them: a GET by name, with the name the Command
// carries from Spawn or Attach, makes that ErrNotFound. The same refusal
// of a sandbox that is still there stands.
func TestStdinAndStreamOfADeletedSandboxAreNotFound(t *testing.T) {
	srv, p := fakeProvider(t, nil)

	// Still there: the refusal is not the sandbox's absence.
	h := mustCreate(t, p, "stays")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Inject("POST", "/process/execute", -1, daytonatest.Fault{Status: http.StatusUnauthorized})
	var wf *sandbox.WriteFailedError
	if err := p.WriteStdin(ctxT(t), c, []byte("x\n")); !errors.As(err, &wf) {
		t.Fatalf("WriteStdin refused, sandbox present = %v, want WriteFailed", err)
	}
	var de *sandbox.DeniedError
	if err := p.CloseStdin(ctxT(t), c); !errors.As(err, &de) {
		t.Fatalf("CloseStdin refused, sandbox present = %v, want Denied", err)
	}
	srv.ClearFaults()
	if err := p.WriteStdin(ctxT(t), c, []byte("y\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(ctxT(t), c); err != nil {
		t.Fatal(err)
	}
	out, _, term := collect(t, c)
	if term.Kind != sandbox.Exit || term.Code != 0 || string(out) != "y\n" {
		t.Fatalf("the command of a sandbox still there ended %v %d %v, stdout %q", term.Kind, term.Code, term.Err, out)
	}

	// Deleted under the command.
	h = mustCreate(t, p, "goes")
	c, err = p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := p.WriteStdin(ctxT(t), c, []byte("a\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctxT(t), c, []byte("b\n")); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("WriteStdin after the sandbox was deleted = %v, want ErrNotFound", err)
	}
	if err := p.CloseStdin(ctxT(t), c); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("CloseStdin after the sandbox was deleted = %v, want ErrNotFound", err)
	}
	_, _, term = collect(t, c)
	if term.Kind != sandbox.Error || !errors.Is(term.Err, sandbox.ErrNotFound) {
		t.Fatalf("the stream of a deleted sandbox ended %v %v, want ErrNotFound", term.Kind, term.Err)
	}
}

// An attached command carries the name too: its stream ends ErrNotFound
// when the sandbox is deleted under it.
func TestAttachedStreamOfADeletedSandboxIsNotFound(t *testing.T) {
	_, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "goes-attached")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sleep", Args: []string{"60"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	a, err := p.Attach(ctxT(t), h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if err := p.Destroy(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []*sandbox.Command{a, c} {
		_, _, term := collect(t, cmd)
		if term.Kind != sandbox.Error || !errors.Is(term.Err, sandbox.ErrNotFound) {
			t.Fatalf("the stream of a deleted sandbox ended %v %v, want ErrNotFound", term.Kind, term.Err)
		}
	}
}
