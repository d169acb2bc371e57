package runner_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

// TestTrustedSemanticsOverWire checks Fountain's runner's trusted-mode
// semantics (spec §2.3–§2.5, §9 invariants 10 and 12) through the wire,
// with provider/local on mechanism/trusted behind the daemon. What
// provider/local does not do yet is reported as a skip naming the gap, so
// the case turns into a pass the day it is fixed.
func TestTrustedSemanticsOverWire(t *testing.T) {
	rp, name := localOverWire(t, "trusted")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := rp.HostPath(h, "/home/sprite")
	if home == "/home/sprite" || !strings.HasPrefix(home, "/") {
		t.Fatalf("host_path of /home/sprite = %q, want the sandbox's host directory", home)
	}
	if got := rp.HostPath(h, "/home/sprite/.local/bin"); got != home+"/.local/bin" {
		t.Fatalf("host_path below /home/sprite = %q", got)
	}
	if got := rp.HostPath(h, "/tmp/x"); got != "/tmp/x" {
		t.Fatalf("host_path of another path = %q", got)
	}
	sh := func(script string, o sandbox.ExecOptions) (sandbox.ExecResult, error) {
		return rp.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, o)
	}
	t.Run("HomeAndDir", func(t *testing.T) {
		res, err := sh(`echo "$HOME"; pwd -P`, sandbox.ExecOptions{Dir: "/home/sprite"})
		if err != nil || res.ExitCode != 0 {
			t.Fatal(res, err)
		}
		if lines := strings.Split(strings.TrimSpace(string(res.Output)), "\n"); len(lines) != 2 || lines[0] != home || !strings.HasSuffix(lines[1], strings.TrimPrefix(home, "/tmp")) {
			t.Fatalf("HOME and pwd = %q, want %s twice", res.Output, home)
		}
	})
	t.Run("ExitCodesAreData", func(t *testing.T) {
		res, err := sh("echo oops >&2; exit 3", sandbox.ExecOptions{StderrToStdout: true})
		if err != nil || res.ExitCode != 3 || string(res.Output) != "oops\n" {
			t.Fatalf("%+v %v", res, err)
		}
		res, err = sh("echo hello; echo err >&2", sandbox.ExecOptions{})
		if err != nil || string(res.Output) != "hello\n" {
			t.Fatalf("stderr must be excluded unless merged: %+v %v", res, err)
		}
		res, err = sh("kill -9 $$", sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 137 {
			t.Fatalf("killed: %+v %v, want 137", res, err)
		}
	})
	t.Run("WriteFileMapsHome", func(t *testing.T) {
		if err := rp.WriteFile(ctx, h, "/home/sprite/.env", []byte("A=1\n"), sandbox.WriteFileOptions{Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		if err := rp.WriteFile(ctx, h, ".claude/skills/x/SKILL.md", []byte("x"), sandbox.WriteFileOptions{}); err != nil {
			t.Fatal(err)
		}
		res, err := sh("cat .env; stat -c %a .env; cat .claude/skills/x/SKILL.md", sandbox.ExecOptions{Dir: "/home/sprite"})
		if err != nil || string(res.Output) != "A=1\n600\nx" {
			t.Fatalf("%q %v", res.Output, err)
		}
	})
	// Fountain's daemon's trusted mode reported a command that cannot start as
	// exit 127. managoat never reports a command that did not run as an exit
	// code (DESIGN's principle): it is Invalid{could_not_run}.
	t.Run("NotStartableIsNeverAnExitCode", func(t *testing.T) {
		res, err := rp.Exec(ctx, h, sandbox.Cmd{Name: "definitely-not-a-command-xyz"}, sandbox.ExecOptions{})
		var inv *sandbox.InvalidError
		if !errors.As(err, &inv) {
			t.Fatalf("%+v %v, want an InvalidError (could not run), never an exit code", res, err)
		}
	})
	t.Run("SpriteHomeInArgsRewritten", func(t *testing.T) {
		res, err := sh("echo /home/sprite/x", sandbox.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Output) != home+"/x\n" {
			t.Fatalf("%q", res.Output)
		}
	})
	t.Run("SandboxPathFirst", func(t *testing.T) {
		res, err := sh(`echo "$PATH"`, sandbox.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(res.Output), home+"/.local/bin:"+home+"/.npm-global/bin:"+home+"/.bun/bin:") {
			t.Fatalf("PATH does not start with the sandbox's .local/bin, .npm-global/bin and .bun/bin (spec §2.4): %s", res.Output)
		}
	})
	// Fountain's daemon kept a sandbox at <root>/<name>; provider/local keys the
	// disk by instance (so a name reused after Destroy never sees the old
	// disk). What the wire promises is that host_path names it.
	t.Run("SandboxDirIsTheHostPath", func(t *testing.T) {
		if st, err := os.Stat(home); err != nil || !st.IsDir() {
			t.Fatalf("host_path %q is not the sandbox's directory: %v", home, err)
		}
	})
}
