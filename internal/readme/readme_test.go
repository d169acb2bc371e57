package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Enclose() // the blocks start sandboxes, in processes of their own
	os.Exit(m.Run())
}

// blocks returns the README's Go code blocks.
func blocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestGoBlocksBuildAndRun writes each Go block of the README, as printed,
// into a package of this module (under testdata, which ./... skips):
// a program (package main) is built and run, as root on the jail, and must
// print its command's output and its session's exit code; a test file is
// run as a test. A block that is not a whole file fails: the README shows
// only code a reader can paste.
func TestGoBlocksBuildAndRun(t *testing.T) {
	gobin, err := exec.LookPath("go")
	testenv.Require(t, err == nil, "the go command builds the README's blocks")
	bs := blocks(t)
	if len(bs) < 2 {
		t.Fatalf("the README has %d Go blocks, want the program and the test", len(bs))
	}
	for i, src := range bs {
		if !strings.HasPrefix(src, "package ") {
			t.Errorf("Go block %d is not a whole file (no package clause):\n%s", i, src)
			continue
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp("testdata", "block")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		abs, _ := filepath.Abs(dir)
		if strings.HasPrefix(src, "package main\n") {
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(t.TempDir(), "readme-program")
			if out, err := exec.Command(gobin, "build", "-o", bin, "./"+dir).CombinedOutput(); err != nil {
				t.Fatalf("Go block %d does not build: %v\n%s", i, err, out)
			}
			testenv.RequireRoot(t) // the program runs on the jail
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), "MANAGOAT_HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "exit 0: hi\n") || !strings.Contains(string(out), ": streamed\nexit 3\n") {
				t.Fatalf("the README's program in %s: %v\n%s", abs, err, out)
			}
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "block_test.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(gobin, "vet", "./"+dir).CombinedOutput(); err != nil {
			t.Fatalf("Go block %d does not build as a test: %v\n%s", i, err, out)
		}
		testenv.RequireRoot(t) // the block's suite runs on the jail
		out, err := exec.Command(gobin, "test", "-count=1", "./"+dir).CombinedOutput()
		if err != nil {
			t.Fatalf("Go block %d, run as a test: %v\n%s", i, err, out)
		}
	}
}
