package readme

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// shBlock is one sh block of the README: its lines, and the line number
// of its first.
type shBlock struct {
	first int
	lines []string
}

// shBlocks returns the README's sh blocks.
func shBlocks(t *testing.T) []shBlock {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []shBlock
	var cur *shBlock
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && line == "```sh":
			cur = &shBlock{first: i + 2}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
	}
	return out
}

// comment is a line's trailing comment (after whitespace and #), "" for none.
var comment = regexp.MustCompile(`(^|\s)#\s.*$`)

// exempt are the lines not run, each with why: they are the test suite
// itself.
var exempt = map[string]string{
	"go test -race ./...": "runs every test, this one among them",
}

// freshClone is a clone of this repository's committed tree (what a new
// user has), or, outside a git checkout, the tree itself.
func freshClone(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	git, err := exec.LookPath("git")
	if err != nil || exec.Command(git, "-C", root, "rev-parse", "--git-dir").Run() != nil {
		t.Logf("not a git checkout: the examples run in %s itself", root)
		return root
	}
	dir := filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command(git, "clone", "--quiet", root, dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	return dir
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// quote is s as one single-quoted word of sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestShellBlocksRun runs every sh block of the README, as written, on a
// fresh clone of the repository, as root (the jail), each block in a bash
// of its own starting at the clone's root, its lines in order, in one
// MANAGOAT_HOME: each line must succeed, or fail where its comment says it
// is refused. What the test adds is only what a person at a terminal
// would: a line with -it gets a terminal (script(1)), fed "exit"; a line
// after a daemon's start (a line ending in &, or terminal 2 after terminal
// 1's serve) is tried again while the daemon starts, for up to 30 s;
// terminal 1's serve, in the foreground there, runs while terminal 2's
// block does; and 127.0.0.1:8080 is a free port (a test takes no fixed
// one). The lines in exempt are not run.
func TestShellBlocksRun(t *testing.T) {
	testenv.RequireRoot(t)
	bash, err := exec.LookPath("bash")
	testenv.Require(t, err == nil, "bash runs the README's sh blocks")
	script, err := exec.LookPath("script")
	testenv.Require(t, err == nil, "script(1) (util-linux) gives the README's -it example a terminal")
	for _, prog := range []string{"make", "python3"} {
		_, err := exec.LookPath(prog)
		testenv.Require(t, err == nil, prog+" (the jail's /usr is the host's) runs in the README's examples")
	}
	goCmd, err := exec.LookPath("go")
	testenv.Require(t, err == nil, "the go command builds and installs managoat as the README says")
	blocks := shBlocks(t)
	if len(blocks) < 4 {
		t.Fatalf("the README has %d sh blocks, want at least the start, the CLI, the runner and the platform", len(blocks))
	}
	for line := range exempt {
		found := false
		for _, b := range blocks {
			for _, l := range b.lines {
				found = found || strings.HasPrefix(l, line)
			}
		}
		if !found {
			t.Errorf("exempt line %q is no longer in the README: drop it from exempt", line)
		}
	}
	clone := freshClone(t)
	home, bin := t.TempDir(), t.TempDir()
	var addr, platformAddr string
	env := []string{"MANAGOAT_HOME=" + home, "GOBIN=" + bin, "PATH=" + bin + ":" + filepath.Dir(goCmd) + ":" + os.Getenv("PATH"),
		"MANAGOAT_CONFIG=/nonexistent/managoat-readme-config", "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(), "LANG=C.UTF-8", "TERM=xterm"}
	for _, k := range []string{"GOPATH", "GOCACHE", "GOMODCACHE", "GOFLAGS", "GOPROXY", "CI"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if v := os.Getenv("GOCACHE"); v == "" {
		if out, err := exec.Command(goCmd, "env", "GOCACHE", "GOMODCACHE").Output(); err == nil {
			f := strings.Fields(string(out))
			if len(f) == 2 {
				env = append(env, "GOCACHE="+f[0], "GOMODCACHE="+f[1])
			}
		}
	}
	type group struct {
		cmd  *exec.Cmd
		keep bool
	}
	var running []group
	kill := func(keepTerminal1 bool) {
		var left []group
		for _, g := range running {
			if keepTerminal1 && g.keep {
				left = append(left, g)
				continue
			}
			_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGTERM)
			// Gone before the next block starts its own (serve's records
			// are one serve's at a time).
			for deadline := time.Now().Add(15 * time.Second); syscall.Kill(-g.cmd.Process.Pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
		}
		running = left
	}
	t.Cleanup(func() {
		// The sandboxes the examples left: the platform's first, while
		// its serve runs, then this host's.
		mg := filepath.Join(bin, "managoat")
		if key, err := os.ReadFile(filepath.Join(clone, "me.key")); err == nil {
			c := exec.Command(mg, "rm", "-f", "box")
			c.Env = append(env, "MANAGOAT_URL=http://"+platformAddr, "MANAGOAT_API_KEY="+strings.TrimSpace(string(key)))
			_ = c.Run()
		}
		kill(false)
		c := exec.Command(mg, "ls", "-q")
		c.Env = env
		if out, err := c.Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
			c := exec.Command(mg, append([]string{"rm", "-f"}, strings.Fields(string(out))...)...)
			c.Env = env
			_ = c.Run()
		}
	})
	for _, b := range blocks {
		terminal := ""
		if len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "# terminal ") {
			terminal = strings.TrimSuffix(strings.Fields(b.lines[0])[2], ":")
		}
		kill(terminal == "2")
		if terminal != "2" {
			addr = freeAddr(t) // each serve its own; terminal 2 reaches terminal 1's
		}
		if terminal == "1" {
			platformAddr = addr
		}
		var s strings.Builder
		s.WriteString("__try() { for __i in $(seq 1 150); do if eval \"$1\"; then return 0; fi; sleep 0.2; done; return 1; }\n")
		retry := terminal == "2"
		for i, line := range b.lines {
			n := b.first + i
			cmdText := strings.TrimSpace(comment.ReplaceAllString(line, ""))
			note := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(comment.FindString(line)), "#"))
			if cmdText == "" {
				continue
			}
			if why, ok := exempt[cmdText]; ok {
				t.Logf("README line %d not run (%s): %s", n, why, cmdText)
				continue
			}
			run := strings.ReplaceAll(cmdText, "127.0.0.1:8080", addr)
			background := strings.HasSuffix(run, "&")
			if terminal == "1" && strings.HasPrefix(run, "managoat serve --listen") {
				background, run = true, run+" &" // terminal 1's serve serves terminal 2
			}
			switch {
			case background:
			case strings.Contains(run, " -it "):
				run = "printf 'echo \"$KEY $GREETING\"; exit\\n' | " + quote(script) + " -qec " + quote(run) + " /dev/null"
			case retry && !strings.HasPrefix(cmdText, "export "):
				run = "__try " + quote(run)
			}
			fmt.Fprintf(&s, "echo '>>> README line %d' >&2\n%s\n", n, run)
			if !background {
				if strings.HasPrefix(note, "refused") {
					fmt.Fprintf(&s, "if [ $? -eq 0 ]; then echo 'README line %d was not refused: '%s >&2; exit 1; fi\n", n, quote(cmdText))
				} else {
					fmt.Fprintf(&s, "__rc=$?; if [ $__rc -ne 0 ]; then echo \"README line %d exited $__rc: \"%s >&2; exit 1; fi\n", n, quote(cmdText))
				}
			}
			retry = background || retry && strings.HasPrefix(cmdText, "export ") // the next command is tried again
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		c := exec.CommandContext(ctx, bash, "-c", s.String())
		c.Dir, c.Env = clone, env
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		// A file, not a pipe: a daemon the block leaves running holds it,
		// and Wait waits for bash alone.
		out, err := os.CreateTemp(t.TempDir(), "block")
		if err != nil {
			t.Fatal(err)
		}
		c.Stdout, c.Stderr = out, out
		err = c.Start()
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		running = append(running, group{c, terminal == "1"})
		err = c.Wait()
		cancel()
		b2, _ := os.ReadFile(out.Name())
		out.Close()
		if err != nil {
			o := string(b2)
			if len(o) > 8000 {
				o = "..." + o[len(o)-8000:]
			}
			t.Fatalf("the README's sh block at line %d: %v\n%s", b.first, err, o)
		}
		t.Logf("the README's sh block at line %d ran", b.first)
	}
}
