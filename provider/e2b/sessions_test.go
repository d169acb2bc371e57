package e2b_test

import (
	"errors"
	"github.com/managoat/managoat/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

func TestAttachRefusesWhatItCannotReplay(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("attach-1")
	// A spawn that was not Detachable is no session and cannot be attached.
	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo x; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	<-c.Events()
	if c.SessionID != "" {
		t.Fatalf("a non-detachable spawn has session id %q", c.SessionID)
	}
	ss, err := e.p.ListSessions(ctx(t), h)
	if err != nil || len(ss) != 0 {
		t.Fatalf("ListSessions = %v, %v; want none", ss, err)
	}
	procs := 0
	for _, sb := range e.srv.Sandboxes() {
		procs += sb.Processes
	}
	if procs != 1 {
		t.Fatalf("%d processes", procs)
	}
	for _, id := range []string{"fountain-nosuch", "nosuch"} {
		if _, err := e.p.Attach(ctx(t), h, id, sandbox.AttachOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Attach(%q) = %v, want ErrNotFound", id, err)
		}
	}
	if _, err := e.p.Attach(ctx(t), h, "../etc", sandbox.AttachOptions{}); sandbox.Kind(err) != "invalid" {
		t.Fatalf("Attach(../etc) = %v, want Invalid", err)
	}
}

func TestStdinTotality(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("stdin-1")
	// A Command this provider never made, or one without private state.
	for _, c := range []*sandbox.Command{
		{Provider: e2b.Name, Ref: "r"},
		{Provider: e2b.Name, Ref: "r", Private: "junk"},
	} {
		if err := e.p.WriteStdin(ctx(t), c, []byte("x")); !errors.Is(err, sandbox.ErrCommandExited) {
			t.Fatalf("WriteStdin = %v", err)
		}
		if err := e.p.CloseStdin(ctx(t), c); !errors.Is(err, sandbox.ErrCommandExited) {
			t.Fatalf("CloseStdin = %v", err)
		}
		if err := e.p.StopCommand(c); err != nil {
			t.Fatalf("StopCommand = %v", err)
		}
	}
	if err := e.p.StopCommand(nil); err != nil {
		t.Fatal(err)
	}
	if err := e.p.WriteStdin(ctx(t), nil, nil); sandbox.Kind(err) != "invalid" {
		t.Fatalf("WriteStdin(nil) = %v", err)
	}
	// A process that exited: ErrCommandExited from the provider directly.
	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, c, 5*time.Second)
	if err := e.p.WriteStdin(ctx(t), c, []byte("late")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("WriteStdin after exit = %v", err)
	}
	if err := e.p.CloseStdin(ctx(t), c); err != nil {
		t.Fatalf("CloseStdin after exit = %v", err)
	}
	// A stdin write that fails otherwise is WriteFailed.
	c, err = e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/SendInput", Status: 503})
	var wf *sandbox.WriteFailedError
	if err := c.WriteStdin(ctx(t), []byte("x")); !errors.As(err, &wf) {
		t.Fatalf("WriteStdin on a 503 = %v", err)
	}
	_ = c.CloseStdin(ctx(t))
	if _, _, term := collect(t, c, 5*time.Second); term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("cat ended %+v", term)
	}
}

func TestSpawnEnvDirStderrAndSignals(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("spawn-1")
	dir := t.TempDir()
	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", `echo "$FOO"; pwd; echo err >&2; kill -TERM $$`}},
		sandbox.SpawnOptions{Env: []string{"FOO=bar baz"}, Dir: dir, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, term := collect(t, c, 5*time.Second)
	if out != "bar baz\n"+dir+"\n" || errOut != "err\n" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
	if term.Kind != sandbox.Exit || term.Code != 128+15 {
		t.Fatalf("terminal %+v, want exit 143", term)
	}
	// The finished session replays both streams and its exit code.
	a, err := e.p.Attach(ctx(t), h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out2, errOut2, term2 := collect(t, a, 5*time.Second)
	if out2 != out || errOut2 != errOut || term2.Kind != sandbox.Exit || term2.Code != 143 {
		t.Fatalf("replay %q %q %+v", out2, errOut2, term2)
	}
}

func TestWriteReadFile(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("files-1")
	path := filepath.Join(t.TempDir(), "a", "b", "f.txt")
	data := []byte("line1\n\x00binary\xff")
	if err := e.p.WriteFile(ctx(t), h, path, data, sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := e.p.ReadFile(ctx(t), h, path)
	if err != nil || string(got) != string(data) {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	if _, err := e.p.ReadFile(ctx(t), h, path+".missing"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("ReadFile(missing) = %v", err)
	}
	var wrote bool
	for _, r := range e.srv.Requests() {
		if r.Method == "POST" && r.Path == "/files" && strings.Contains(r.Query, "username=user") {
			wrote = true
		}
	}
	if !wrote {
		t.Fatal("no multipart upload to /files")
	}
}

// The shim run by the real bash passes every argument through intact and
// journals exactly the bytes the command wrote.
func TestShimQuoting(t *testing.T) {
	_, err := exec.LookPath("bash")
	testenv.Require(t, err == nil, "bash is not installed (the shim runs under bash)")
	args := []string{"plain", "with space", "it's", `a'\''b`, "dq\"x", "new\nline", "$HOME", "`id`", `back\slash`, "", "*", "tab\there", "ünï"}
	cases := []struct {
		name   string
		argv   []string
		stdout string
		stderr string
		code   string
	}{
		{"args", append([]string{"printf", "[%s]"}, args...), "[" + strings.Join(args, "][") + "]", "", "0"},
		{"stderr and status", []string{"sh", "-c", "printf out; printf 'e r r' >&2; exit 7"}, "out", "e r r", "7"},
		{"not found", []string{"/no/such/cmd"}, "", "", "127"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jd := t.TempDir()
			tag := "fountain-shim" + string(rune('a'+i))
			cmd := exec.Command("bash", "-c", e2b.ShimScript(tag, tc.argv))
			cmd.Env = append(os.Environ(), e2b.JournalDirEnv+"="+jd)
			var so, se strings.Builder
			cmd.Stdout, cmd.Stderr = &so, &se
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if so.String() != tc.stdout || strconv.Itoa(code) != tc.code {
				t.Fatalf("stdout %q code %d; want %q %s", so.String(), code, tc.stdout, tc.code)
			}
			if tc.stderr != "" && se.String() != tc.stderr {
				t.Fatalf("stderr %q", se.String())
			}
			read := func(ext string) string {
				b, err := os.ReadFile(filepath.Join(jd, tag+ext))
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			if read(".out") != tc.stdout || read(".err") != se.String() || read(".exit") != tc.code+"\n" {
				t.Fatalf("journals %q %q %q", read(".out"), read(".err"), read(".exit"))
			}
			// The replayer over the finished journal gives the same bytes back.
			rp := exec.Command("bash", "-c", e2b.ReplayScript(tag))
			rp.Env = cmd.Env
			var ro, re strings.Builder
			rp.Stdout, rp.Stderr = &ro, &re
			if err := rp.Run(); err != nil || ro.String() != tc.stdout || re.String() != se.String() {
				t.Fatalf("replay %q %q %v", ro.String(), re.String(), err)
			}
		})
	}
	if q := e2b.QuoteArgv([]string{"a'b", "c d"}); q != `'a'\''b' 'c d'` {
		t.Fatalf("QuoteArgv = %s", q)
	}
}
