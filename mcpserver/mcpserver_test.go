package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mcpserver"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisor()
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// localBackend is a local provider on the jail (as root) in a temporary
// state directory; every sandbox left is destroyed at the end.
func localBackend(t testing.TB) (*local.Provider, *mcpserver.Backend) {
	t.Helper()
	testenv.RequireRoot(t)
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "jail"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		names, _ := p.ListAllNames(ctx)
		for _, n := range names {
			_ = p.Destroy(ctx, sandbox.BuildHandle(local.Name, n))
		}
	})
	return p, &mcpserver.Backend{Registry: sandbox.NewRegistry(p), Provider: local.Name}
}

// connect serves srv over an in-memory transport and returns the Go
// SDK's client session of it, and what ends it and waits for the server.
func connect(t testing.TB, srv *mcpserver.Server, opts *mcp.ClientOptions) (*mcp.ClientSession, func()) {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts)
	cs, err := c.Connect(context.Background(), ct, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			cs.Close()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Error("server did not end")
			}
			cancel()
		})
	}
	t.Cleanup(end)
	return cs, end
}

func call(t testing.TB, cs *mcp.ClientSession, name string, args any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error %s", name, text(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured %s: %v", name, b, err)
		}
		// The text is the same JSON.
		var fromText map[string]any
		if err := json.Unmarshal([]byte(text(res)), &fromText); err != nil {
			t.Fatalf("%s: text is not the JSON result: %q", name, text(res))
		}
	}
	return res
}

// callErr calls name and returns its tool error (failing when it did not fail).
func callErr(t testing.TB, cs *mcp.ClientSession, name string, args any) mcpserver.ToolError {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v, want a tool error", name, err)
	}
	if !res.IsError {
		t.Fatalf("%s: succeeded (%s), want a tool error", name, text(res))
	}
	var e struct{ Error mcpserver.ToolError }
	if err := json.Unmarshal([]byte(text(res)), &e); err != nil || e.Error.Kind == "" {
		t.Fatalf("%s: error text %q is not {\"error\":{kind...}}", name, text(res))
	}
	if res.Meta[mcpserver.MetaError] == nil {
		t.Fatalf("%s: no _meta %s", name, mcpserver.MetaError)
	}
	return e.Error
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestGoClient drives every tool with the Go SDK's own client on the
// local provider: create, run python3 and read 42, progress of a
// streaming command, files, a detached run followed by session id,
// errors with their kinds, and the session's end destroying its
// sandboxes.
func TestGoClient(t *testing.T) {
	p, b := localBackend(t)
	srv, err := mcpserver.New(mcpserver.Options{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	var progressMu sync.Mutex
	var progress []string
	cs, end := connect(t, srv, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		progressMu.Lock()
		progress = append(progress, r.Params.Message)
		progressMu.Unlock()
	}})
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != len(srv.Tools()) {
		t.Fatalf("listed %d tools, want %d", len(tools.Tools), len(srv.Tools()))
	}
	for _, tl := range tools.Tools {
		if tl.InputSchema == nil || tl.OutputSchema == nil || tl.Description == "" {
			t.Errorf("tool %s lacks a schema or a description", tl.Name)
		}
	}

	var sb mcpserver.SandboxOutput
	call(t, cs, mcpserver.ToolCreate, map[string]any{"labels": map[string]string{"purpose": "test"}}, &sb)
	if !strings.HasPrefix(sb.Name, mcpserver.NamePrefix) || sb.Labels[mcpserver.LabelSession] == "" || sb.Labels["purpose"] != "test" {
		t.Fatalf("created %+v", sb)
	}
	info, err := p.Get(context.Background(), sandbox.BuildHandle(local.Name, sb.Name))
	if err != nil || !strings.Contains(string(info.Raw), mcpserver.LabelSession) {
		t.Fatalf("the sandbox does not carry the session's label: %v %s", err, info.Raw)
	}

	var run mcpserver.RunOutput
	call(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "argv": []string{"python3", "-c", "print(6*7)"}}, &run)
	if run.ExitCode == nil || *run.ExitCode != 0 || run.Stdout != "42\n" {
		t.Fatalf("python3: %+v", run)
	}
	call(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "shell": "echo out; echo err >&2; exit 3"}, &run)
	if *run.ExitCode != 3 || run.Stdout != "out\n" || run.Stderr != "err\n" {
		t.Fatalf("shell: %+v", run)
	}
	call(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "argv": []string{"cat"}, "stdin": "fed"}, &run)
	if run.Stdout != "fed" {
		t.Fatalf("stdin: %+v", run)
	}

	// Progress: a command that prints over a second, with a token.
	ctx := context.Background()
	params := &mcp.CallToolParams{Name: mcpserver.ToolRun, Arguments: map[string]any{"sandbox": sb.Name,
		"shell": "for i in 1 2 3 4 5; do echo tick$i; sleep 0.2; done"}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError {
		t.Fatalf("streaming run: %v %s", err, text(res))
	}
	progressMu.Lock()
	got := strings.Join(progress, "")
	n := len(progress)
	progressMu.Unlock()
	if !strings.Contains(got, "tick1") || !strings.Contains(got, "tick5") || n < 2 {
		t.Fatalf("progress notifications %q (%d), want the ticks in several", got, n)
	}

	// Files.
	call(t, cs, mcpserver.ToolFileWrite, map[string]any{"sandbox": sb.Name, "path": "dir/hello.txt", "content": "hello\n"}, nil)
	var fr mcpserver.FileReadOutput
	call(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "dir/hello.txt"}, &fr)
	if fr.Content != "hello\n" || fr.Size != 6 {
		t.Fatalf("read %+v", fr)
	}
	call(t, cs, mcpserver.ToolFileWrite, map[string]any{"sandbox": sb.Name, "path": "bin.dat", "content": "AP8A/w==", "encoding": "base64"}, nil)
	call(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "bin.dat", "encoding": "base64"}, &fr)
	if fr.Content != "AP8A/w==" || fr.Bytes != 4 {
		t.Fatalf("read base64 %+v", fr)
	}
	if e := callErr(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "bin.dat"}); e.Kind != mcpserver.KindInvalid || !strings.Contains(e.Message, "base64") {
		t.Errorf("binary read as text: %+v", e)
	}
	var ls mcpserver.FileListOutput
	call(t, cs, mcpserver.ToolFileList, map[string]any{"sandbox": sb.Name}, &ls)
	names := map[string]string{}
	for _, e := range ls.Entries {
		names[e.Name] = e.Type
	}
	if names["dir"] != "dir" || names["bin.dat"] != "file" {
		t.Fatalf("list %+v", ls)
	}
	if e := callErr(t, cs, mcpserver.ToolFileDelete, map[string]any{"sandbox": sb.Name, "path": "dir"}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("delete of a full directory without recursive: %+v", e)
	}
	call(t, cs, mcpserver.ToolFileDelete, map[string]any{"sandbox": sb.Name, "path": "dir", "recursive": true}, nil)
	if e := callErr(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "dir/hello.txt"}); e.Kind != mcpserver.KindNotFound {
		t.Errorf("read of a deleted file: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolFileList, map[string]any{"sandbox": sb.Name, "path": "nope"}); e.Kind != mcpserver.KindNotFound {
		t.Errorf("list of a missing directory: %+v", e)
	}

	// Detached, followed by session id.
	call(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "shell": "echo a; sleep 1; echo b", "detach": true}, &run)
	if run.SessionID == "" {
		t.Fatalf("detached: %+v", run)
	}
	var sr mcpserver.SessionReadOutput
	var all string
	off := int64(0)
	for i := 0; i < 40 && !sr.Exited; i++ {
		call(t, cs, mcpserver.ToolSessionRead, map[string]any{"sandbox": sb.Name, "session_id": run.SessionID, "offset": off, "wait_seconds": 1}, &sr)
		all += sr.Stdout
		off = sr.NextOffset
	}
	if all != "a\nb\n" || !sr.Exited || *sr.ExitCode != 0 {
		t.Fatalf("followed %q, last %+v", all, sr)
	}

	// Errors and their kinds.
	if e := callErr(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": "mcp-nope-0000", "argv": []string{"true"}}); e.Kind != mcpserver.KindNotFound {
		t.Errorf("unknown sandbox: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "argv": []string{"true"}, "bogus": 1}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("unknown field: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "argv": "true"}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("argv of the wrong type: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolRun, map[string]any{"sandbox": sb.Name, "shell": "sleep 30", "timeout_seconds": 0.5}); e.Kind != mcpserver.KindTimeout {
		t.Errorf("timeout: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "a\x00b"}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("NUL path: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolFileRead, map[string]any{"sandbox": sb.Name, "path": "../../etc/passwd"}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("escaping path: %+v", e)
	}
	big := strings.Repeat("x", mcpserver.MaxFileBytes+1)
	if e := callErr(t, cs, mcpserver.ToolFileWrite, map[string]any{"sandbox": sb.Name, "path": "big", "content": big}); e.Kind != mcpserver.KindLimit {
		t.Errorf("oversize write: %+v", e)
	}
	if e := callErr(t, cs, mcpserver.ToolCreate, map[string]any{"allow": []string{"http://example.com/x"}}); e.Kind != mcpserver.KindInvalid {
		t.Errorf("bad allow entry: %+v", e)
	}

	var list mcpserver.ListOutput
	call(t, cs, mcpserver.ToolList, map[string]any{}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != sb.Name || list.Sandboxes[0].Status != "running" {
		t.Fatalf("list %+v", list)
	}
	// A second sandbox is left for the session's end to destroy.
	var sb2 mcpserver.SandboxOutput
	call(t, cs, mcpserver.ToolCreate, map[string]any{}, &sb2)
	call(t, cs, mcpserver.ToolDestroy, map[string]any{"sandbox": sb.Name}, nil)
	if _, err := p.Get(ctx, sandbox.BuildHandle(local.Name, sb.Name)); err == nil {
		t.Fatalf("%s is there after sandbox_destroy", sb.Name)
	}
	end()
	names2, err := p.ListAllNames(ctx)
	if err != nil || len(names2) != 0 {
		t.Fatalf("after the session ended the provider holds %v (%v)", names2, err)
	}
}

// TestOutputBounded: a command printing 10 MiB leaves the server's heap
// within the documented bound, the result holds max_output_bytes and says
// it is truncated with the whole count, and the progress notifications
// are bounded too.
func TestOutputBounded(t *testing.T) {
	_, b := localBackend(t)
	srv, _ := mcpserver.New(mcpserver.Options{Backend: b})
	var notified atomic.Int64
	cs, _ := connect(t, srv, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		notified.Add(int64(len(r.Params.Message)))
	}})
	var sb mcpserver.SandboxOutput
	call(t, cs, mcpserver.ToolCreate, map[string]any{}, &sb)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			// What is live (held), not garbage waiting for a GC.
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	const size = 10 << 20
	maxOut, _ := strconv.Atoi(os.Getenv("MAXOUT"))
	if maxOut == 0 {
		maxOut = mcpserver.MaxOutputBytes
	}
	params := &mcp.CallToolParams{Name: mcpserver.ToolRun, Arguments: map[string]any{"sandbox": sb.Name,
		"shell": "head -c 10485760 /dev/zero | tr '\\0' x", "max_output_bytes": maxOut}}
	params.SetProgressToken(7)
	res, err := cs.CallTool(context.Background(), params)
	close(stop)
	<-sampled
	if err != nil || res.IsError {
		t.Fatalf("%v %s", err, text(res))
	}
	var run mcpserver.RunOutput
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &run)
	if run.StdoutBytes != size || len(run.Stdout) != maxOut || !run.Truncated {
		t.Fatalf("stdout_bytes %d, kept %d, truncated %v", run.StdoutBytes, len(run.Stdout), run.Truncated)
	}
	growth := int64(peak.Load()) - int64(before.HeapAlloc)
	// Server and in-process client together: the stream's queue (2 MiB),
	// MaxOutputBytes kept, the notifications' buffer, the result's JSON
	// (text and structured), its JSON-RPC encoding, and the client's
	// decoded copies: 32 MiB, against 10 MiB of output, and each copy of
	// it, were it held (over 40 MiB).
	const bound = 32 << 20
	t.Logf("heap growth at peak %d bytes (bound %d); %d bytes notified", growth, bound, notified.Load())
	if growth > bound {
		t.Fatalf("heap grew %d bytes during a 10 MiB run, more than the bound %d", growth, bound)
	}
	if notified.Load() == 0 {
		t.Fatal("no progress notified")
	}
}

// TestSweepVanished: sandboxes labelled with an owner that is gone (a
// managoat mcp killed with SIGKILL) are destroyed by Sweep; those of a
// live owner, and those of no MCP owner, are kept.
func TestSweepVanished(t *testing.T) {
	p, b := localBackend(t)
	ctx := context.Background()
	mk := func(name string, labels map[string]string) {
		if _, err := b.Registry.Create(ctx, local.Name, name, sandbox.CreateOptions{Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	mk("mcp-dead-0001", map[string]string{mcpserver.LabelSession: "dead", mcpserver.LabelOwner: "boot:1:1"})
	mk("mcp-live-0001", map[string]string{mcpserver.LabelSession: "live", mcpserver.LabelOwner: mcpserver.Owner()})
	mk("mcp-user-0001", nil)
	n, err := mcpserver.Sweep(ctx, b.Registry, local.Name)
	if err != nil || n != 1 {
		t.Fatalf("Sweep: %d, %v; want 1 destroyed", n, err)
	}
	names, _ := p.ListAllNames(ctx)
	if strings.Join(names, ",") != "mcp-live-0001,mcp-user-0001" {
		t.Fatalf("left %v", names)
	}
}

// TestIdleEndsSession: a session with no call for Options.Idle ends, and
// its sandbox is destroyed.
func TestIdleEndsSession(t *testing.T) {
	p, b := localBackend(t)
	srv, _ := mcpserver.New(mcpserver.Options{Backend: b, Idle: 300 * time.Millisecond})
	cs, _ := connect(t, srv, nil)
	var sb mcpserver.SandboxOutput
	call(t, cs, mcpserver.ToolCreate, map[string]any{}, &sb)
	deadline := time.Now().Add(time.Minute)
	for {
		names, _ := p.ListAllNames(context.Background())
		if len(names) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle session's sandbox %v is still there", names)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cs.Wait(); err == nil {
		_ = err // the session is closed by the server
	}
}

var _ = os.Getpid
