// Package nodesdk runs a vendor's JavaScript SDK under Node for a Go test,
// so a fake (or a front door) is checked by the vendor's own client.
//
// A test asks for the SDK by exact version and runs a script against its
// server:
//
//	sdk := nodesdk.Setup(t, "e2b@2.51.0")
//	res := sdk.Run(t, "testdata/sdk.mjs", nodesdk.Options{
//		Env:     map[string]string{"E2B_API_URL": srv.URL},
//		Timeout: 2 * time.Minute,
//	})
//	res.Call(t, "create").Value(t, &info)
//
// Setup finds node and npm on PATH; where either is missing the test skips
// with the reason, and under CI=true it fails (internal/testenv). Packages
// are installed with `npm install --no-audit --no-fund --ignore-scripts
// --save-exact` into a cache shared by test runs,
// os.UserCacheDir()/managoat-nodesdk/<hash of the package list>, under an
// flock(2) on that directory so parallel test binaries install once and never
// see a half-made tree. npm uses the registry it is configured for (nothing
// here names one). Each package must be pinned to an exact version
// (name@1.2.3), and after installing, the version in node_modules is checked.
//
// Run copies the script, and every other .mjs file beside it, into a fresh
// directory whose node_modules links to the cache, writes the reporting
// helper nodesdk.mjs next to them, and runs `node script.mjs` there with a
// clean environment (PATH, HOME, TMPDIR and the given variables only: a
// developer's own vendor keys never leak into a test) and a bounded
// timeout, after which the script's whole process group is killed. Stdout
// and stderr are kept up to Options.MaxOutput bytes each.
//
// The script reports each call through the helper:
//
//	import { call, done } from './nodesdk.mjs'
//	const sbx = await call('create', () => Sandbox.create({ timeoutMs: 60_000 }), s => ({ id: s.sandboxId }))
//	await call('kill missing', () => Sandbox.kill('nope'))
//	done()
//
// call runs fn and prints one JSON line, prefixed "@@nodesdk " so an SDK's
// own logging cannot be taken for a result: {"call":name,"ok":true,"value":…}
// or {"call":name,"ok":false,"error":{"name":…,"message":…}}, where name is the
// thrown error's class (NotFoundError, CommandExitError, …). The optional
// third argument maps the result to what is reported (an SDK object is
// rarely plain JSON); Uint8Array and ArrayBuffer values become
// {"$bytes":"<base64>"}, Dates ISO strings, bigints decimal strings. call
// returns fn's result, or undefined when it threw. done prints the final
// line {"done":true}; a Result without it means the script did not reach
// its end, and Result.Call reports that with the script's stderr.
package nodesdk

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/internal/testenv"
)

//go:embed nodesdk.mjs
var helper []byte

// Prefix begins every line the helper prints.
const Prefix = "@@nodesdk "

// Runtime is a node and an npm, and where packages are cached.
type Runtime struct {
	Node, Npm string
	// CacheDir holds one directory per package list; empty is
	// os.UserCacheDir()/managoat-nodesdk.
	CacheDir string
	// InstallTimeout bounds one npm install; zero is 5 minutes.
	InstallTimeout time.Duration
}

// Find looks up node and npm on PATH and checks that node runs.
func Find() (Runtime, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return Runtime{}, fmt.Errorf("node not found on PATH (Debian: apt-get install nodejs npm): %w", err)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return Runtime{}, fmt.Errorf("npm not found on PATH (Debian: apt-get install npm): %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, node, "--version").CombinedOutput(); err != nil {
		return Runtime{}, fmt.Errorf("%s --version: %v: %s", node, err, bytes.TrimSpace(out))
	}
	return Runtime{Node: node, Npm: npm}, nil
}

// SDK is a set of installed packages ready to run scripts with.
type SDK struct {
	rt   Runtime
	dir  string // holds node_modules
	pkgs []string
}

// Setup finds node and npm (skipping t, or failing it under CI=true, when
// they are missing) and installs pkgs; a failed install fails t.
func Setup(t testing.TB, pkgs ...string) *SDK {
	t.Helper()
	rt, err := Find()
	testenv.Require(t, err == nil, fmt.Sprint("nodesdk: ", err))
	ctx, cancel := context.WithTimeout(context.Background(), rt.installTimeout()+time.Minute)
	defer cancel()
	sdk, err := rt.Install(ctx, pkgs...)
	if err != nil {
		t.Fatalf("nodesdk: %v", err)
	}
	return sdk
}

func (rt Runtime) installTimeout() time.Duration {
	if rt.InstallTimeout > 0 {
		return rt.InstallTimeout
	}
	return 5 * time.Minute
}

// exact is a package pinned to one version: name@1.2.3 or @scope/name@1.2.3-rc.1.
var exact = regexp.MustCompile(`^((?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*)@(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$`)

// Install installs pkgs (each name@exact-version) in the cache, once per
// package list however many processes ask at the same time.
func (rt Runtime) Install(ctx context.Context, pkgs ...string) (*SDK, error) {
	pkgs = slices.Clone(pkgs)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	for _, p := range pkgs {
		if !exact.MatchString(p) {
			return nil, fmt.Errorf("package %q is not pinned to an exact version (name@1.2.3)", p)
		}
	}
	root := rt.CacheDir
	if root == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("no cache directory: %w", err)
		}
		root = filepath.Join(c, "managoat-nodesdk")
	}
	sum := sha256.Sum256([]byte(strings.Join(pkgs, "\n")))
	dir := filepath.Join(root, hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer unlock()
	sdk := &SDK{rt: rt, dir: dir, pkgs: pkgs}
	marker := filepath.Join(dir, "installed")
	if b, err := os.ReadFile(marker); err == nil && string(b) == strings.Join(pkgs, "\n") {
		if err := sdk.verify(); err == nil {
			return sdk, nil
		}
	}
	// Start again from nothing: a tree left by a killed install is not trusted.
	os.Remove(marker)
	for _, name := range []string{"node_modules", "package.json", "package-lock.json"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private":true,"name":"managoat-nodesdk-cache"}`+"\n"), 0o644); err != nil {
		return nil, err
	}
	if len(pkgs) > 0 {
		ictx, cancel := context.WithTimeout(ctx, rt.installTimeout())
		defer cancel()
		args := append([]string{"install", "--no-audit", "--no-fund", "--ignore-scripts", "--save-exact", "--no-package-lock"}, pkgs...)
		cmd := exec.CommandContext(ictx, rt.Npm, args...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		out := &capped{max: 64 << 10}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("npm install %s: %v\n%s", strings.Join(pkgs, " "), err, out.b.Bytes())
		}
	}
	if err := sdk.verify(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(marker, []byte(strings.Join(pkgs, "\n")), 0o644); err != nil {
		return nil, err
	}
	return sdk, nil
}

// verify checks each package's installed version is the pinned one.
func (s *SDK) verify() error {
	for _, p := range s.pkgs {
		m := exact.FindStringSubmatch(p)
		b, err := os.ReadFile(filepath.Join(s.dir, "node_modules", filepath.FromSlash(m[1]), "package.json"))
		if err != nil {
			return fmt.Errorf("%s not installed: %w", p, err)
		}
		var pj struct{ Version string }
		if err := json.Unmarshal(b, &pj); err != nil {
			return fmt.Errorf("%s: package.json: %w", p, err)
		}
		if pj.Version != m[2] {
			return fmt.Errorf("%s: installed version is %q", p, pj.Version)
		}
	}
	return nil
}

// Dir is the directory whose node_modules holds the packages (to read a
// package's shipped sources from a test, say).
func (s *SDK) Dir() string { return s.dir }

// Options are a Run's.
type Options struct {
	// Env is added to the script's clean environment.
	Env map[string]string
	// Args follow the script's name.
	Args []string
	// Timeout bounds the run; zero is 2 minutes.
	Timeout time.Duration
	// MaxOutput caps what is kept of stdout and of stderr; zero is 8 MiB.
	MaxOutput int
}

// Result is what a script did.
type Result struct {
	Stdout, Stderr []byte
	// ExitCode is the script's, or -1 when it was killed (TimedOut, say).
	ExitCode int
	TimedOut bool
	// Calls are the reported calls in order; Done tells the script
	// reported reaching its end.
	Calls []Call
	Done  bool
}

// Call is one reported call.
type Call struct {
	Name  string          `json:"call"`
	OK    bool            `json:"ok"`
	Raw   json.RawMessage `json:"value,omitempty"`
	Error *struct {
		Name    string `json:"name"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Run runs script (a .mjs file) and parses what it reported. A script
// that cannot be started fails t; its exit code, timeout and calls are in
// the Result for the test to judge.
func (s *SDK) Run(t testing.TB, script string, o Options) *Result {
	t.Helper()
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := s.RunContext(ctx, script, o)
	if err != nil {
		t.Fatalf("nodesdk: %v", err)
	}
	return res
}

// RunContext is Run under ctx, without a testing.TB; the run's directory
// is removed when it ends.
func (s *SDK) RunContext(ctx context.Context, script string, o Options) (*Result, error) {
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	work, err := os.MkdirTemp("", "nodesdk-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	src := filepath.Dir(script)
	siblings, err := filepath.Glob(filepath.Join(src, "*.mjs"))
	if err != nil {
		return nil, err
	}
	if !slices.Contains(siblings, filepath.Join(src, filepath.Base(script))) {
		siblings = append(siblings, script)
	}
	for _, f := range siblings {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(work, filepath.Base(f)), b, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(work, "nodesdk.mjs"), helper, 0o644); err != nil {
		return nil, err
	}
	if err := os.Symlink(filepath.Join(s.dir, "node_modules"), filepath.Join(work, "node_modules")); err != nil {
		return nil, err
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + work, "NO_COLOR=1"}
	for k, v := range o.Env {
		env = append(env, k+"="+v)
	}
	cmd := exec.CommandContext(ctx, s.rt.Node, append([]string{filepath.Base(script)}, o.Args...)...)
	cmd.Dir = work
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	max := o.MaxOutput
	if max <= 0 {
		max = 8 << 20
	}
	stdout, stderr := &capped{max: max}, &capped{max: max}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Run()
	// Whatever the script left in its group (a child it spawned) goes too.
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	res := &Result{Stdout: stdout.b.Bytes(), Stderr: stderr.b.Bytes(), ExitCode: -1}
	var exit *exec.ExitError
	switch {
	case runErr == nil:
		res.ExitCode = 0
	case ctx.Err() != nil:
		res.TimedOut = true
	case errors.As(runErr, &exit):
		res.ExitCode = exit.ExitCode()
	default:
		return nil, fmt.Errorf("node %s: %w", script, runErr)
	}
	for line := range strings.Lines(string(res.Stdout)) {
		line, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), Prefix)
		if !ok {
			continue
		}
		if line == `{"done":true}` {
			res.Done = true
			continue
		}
		var c Call
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			return nil, fmt.Errorf("script %s printed a malformed report %q: %w", script, line, err)
		}
		res.Calls = append(res.Calls, c)
	}
	return res, nil
}

// Call is the first reported call named name. It fails t, with the
// script's stderr, when none was, or when the script did not end well
// (timed out, or exited non-zero before reporting its end), so that the
// first assertion names what went wrong.
func (r *Result) Call(t testing.TB, name string) Call {
	t.Helper()
	for _, c := range r.Calls {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("nodesdk: no call %q reported (timed out %v, exit %d, done %v)\nstderr:\n%s", name, r.TimedOut, r.ExitCode, r.Done, tail(r.Stderr, 4096))
	return Call{}
}

// Value unmarshals the call's value into v, failing t when the call threw.
func (c Call) Value(t testing.TB, v any) {
	t.Helper()
	if !c.OK {
		t.Fatalf("%s: threw %s", c.Name, c.Err())
	}
	if v == nil {
		return
	}
	if err := json.Unmarshal(c.Raw, v); err != nil {
		t.Fatalf("%s: value %s: %v", c.Name, c.Raw, err)
	}
}

// Threw fails t unless the call threw an error of class name (the JS
// constructor's name, e.g. "NotFoundError").
func (c Call) Threw(t testing.TB, name string) {
	t.Helper()
	if c.OK {
		t.Fatalf("%s: returned %s, want it to throw %s", c.Name, c.Raw, name)
	}
	if c.Error.Name != name {
		t.Fatalf("%s: threw %s, want %s", c.Name, c.Err(), name)
	}
}

// Err describes what the call threw ("" when it did not).
func (c Call) Err() string {
	if c.OK || c.Error == nil {
		return ""
	}
	return c.Error.Name + ": " + c.Error.Message
}

// Bytes decodes a {"$bytes": base64} value.
func Bytes(raw json.RawMessage) ([]byte, error) {
	var v struct {
		B []byte `json:"$bytes"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v.B, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// capped keeps the first max bytes written and drops the rest.
type capped struct {
	mu  sync.Mutex
	b   bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
