package daytona_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/provider/daytona/daytonatest"
	"github.com/managoat/managoat/sandbox"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustCreate(t *testing.T, p *daytona.Provider, name string) *sandbox.Handle {
	t.Helper()
	h, err := p.Create(ctxT(t), name, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
	return h
}

// collect reads c to its terminal event.
func collect(t *testing.T, c *sandbox.Command) (stdout, stderr []byte, term sandbox.Event) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("events closed without a terminal event")
			}
			switch ev.Kind {
			case sandbox.Stdout:
				stdout = append(stdout, ev.Data...)
			case sandbox.Stderr:
				stderr = append(stderr, ev.Data...)
			default:
				return stdout, stderr, ev
			}
		case <-deadline:
			_ = c.Stop()
			t.Fatalf("no terminal event (stdout so far %q)", stdout)
		}
	}
}

func countRequests(srv *daytonatest.Server, prefix string) int {
	n := 0
	for _, r := range srv.Requests() {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func TestCreateAdoptsAfterConflictProbe(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusBadRequest} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.ConflictStatus = status })
			mustCreate(t, p, "adopt-me")
			before := countRequests(srv, "GET /api/sandbox/adopt-me")
			h := mustCreate(t, p, "adopt-me")
			if h.Name != "adopt-me" || h.Provider != daytona.Name {
				t.Fatalf("adopted handle %v", h)
			}
			if countRequests(srv, "GET /api/sandbox/adopt-me") != before+1 {
				t.Fatalf("no probe GET after %d: %q", status, srv.Requests())
			}
		})
	}
}

func TestCreateBody(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.Snapshots = []string{"snap-1"}
		c.Snapshot = "snap-1"
	})
	mustCreate(t, p, "with-snap")
	sb, _ := srv.Lookup("with-snap")
	if sb.Create["snapshot"] != "snap-1" || sb.Create["autoStopInterval"] != float64(0) ||
		sb.Create["autoArchiveInterval"] != float64(10080) || sb.Labels["managoat"] != "1" {
		t.Fatalf("create body %v", sb.Create)
	}
	_, p2 := fakeProvider(t, nil)
	mustCreate(t, p2, "no-snap")
}

func TestCreateSurfacesOriginalErrorWhenProbeFindsNothing(t *testing.T) {
	srv, p := fakeProvider(t, func(_ *daytonatest.Server, c *daytona.Config) { c.Snapshot = "unregistered" })
	_, err := p.Create(ctxT(t), "snapless", sandbox.CreateOptions{})
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || iv.HTTP == nil || iv.HTTP.Status != 400 || errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Create with an unregistered snapshot = %v, want Invalid{http 400}", err)
	}
	if countRequests(srv, "GET /api/sandbox/snapless") != 1 {
		t.Fatalf("want exactly one probe: %q", srv.Requests())
	}
}

func TestCreate503IsUnavailableWithoutProbe(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	srv.Inject("POST", "/api/sandbox", 1, daytonatest.Fault{Status: 503})
	_, err := p.Create(ctxT(t), "down", sandbox.CreateOptions{})
	if sandbox.Kind(err) != "unavailable" {
		t.Fatalf("Create on 503 = %v", err)
	}
	if countRequests(srv, "GET ") != 0 {
		t.Fatalf("probed after a 503: %q", srv.Requests())
	}
	if _, err := p.Create(ctxT(t), "limited", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 10}}); sandbox.Kind(err) != "invalid" {
		t.Fatalf("Create with limits = %v, want invalid", err)
	}
}

func TestErrorStateIsReportedNeverAdopted(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "broken")
	srv.SetState("broken", "error", "disk full")
	info, err := p.Get(ctxT(t), h)
	if err != nil || info.Status != sandbox.StatusUnknown || !bytes.Contains(info.Raw, []byte("disk full")) {
		t.Fatalf("Get = %v %s, %v; want unknown with the raw body", info.Status, info.Raw, err)
	}
	var pe *sandbox.ProviderError
	if _, err := p.Create(ctxT(t), "broken", sandbox.CreateOptions{}); !errors.As(err, &pe) || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Create on an errored sandbox = %v, want a ProviderError naming the state", err)
	}
	before := countRequests(srv, "POST /toolbox/")
	if _, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); !errors.As(err, &pe) {
		t.Fatalf("Exec on an errored sandbox = %v", err)
	}
	if countRequests(srv, "POST /toolbox/") != before {
		t.Fatalf("the toolbox was called on an errored sandbox")
	}
	if err := p.Suspend(ctxT(t), h); !errors.As(err, &pe) {
		t.Fatalf("Suspend on an errored sandbox = %v", err)
	}
	srv.SetState("broken", "build_failed", "")
	if info, _ := p.Get(ctxT(t), h); info.Status != sandbox.StatusUnknown {
		t.Fatalf("build_failed status %v", info.Status)
	}
	if err := p.Destroy(ctxT(t), h); err != nil {
		t.Fatalf("Destroy an errored sandbox: %v", err)
	}
}

func TestStatusVocabulary(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "states")
	for state, want := range map[string]sandbox.Status{
		"started": sandbox.StatusRunning, "starting": sandbox.StatusRunning, "resuming": sandbox.StatusRunning,
		"stopped": sandbox.StatusSuspended, "stopping": sandbox.StatusSuspended, "archived": sandbox.StatusSuspended,
		"archiving": sandbox.StatusSuspended, "paused": sandbox.StatusSuspended, "pausing": sandbox.StatusSuspended,
		"migrating": sandbox.StatusUnknown, "creating": sandbox.StatusUnknown, "error": sandbox.StatusUnknown,
	} {
		srv.SetState("states", state, "")
		if info, err := p.Get(ctxT(t), h); err != nil || info.Status != want {
			t.Errorf("state %q: %v, %v; want %v", state, info.Status, err, want)
		}
	}
	srv.SetState("states", "destroyed", "")
	if _, err := p.Get(ctxT(t), h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("destroyed = %v, want ErrNotFound", err)
	}
}

func TestSuspendResumeKeepsDisk(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.StartDelay = 200 * time.Millisecond })
	h := mustCreate(t, p, "parker")
	ctx := ctxT(t)
	file := srv.Home("parker") + "/kept.txt"
	if err := p.WriteFile(ctx, h, file, []byte("memory"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	if info, _ := p.Get(ctx, h); info.Status != sandbox.StatusSuspended {
		t.Fatalf("after Suspend: %v", info.Status)
	}
	stops := countRequests(srv, "POST /api/sandbox/parker/stop")
	if err := p.Suspend(ctx, h); err != nil || countRequests(srv, "POST /api/sandbox/parker/stop") != stops {
		t.Fatalf("second Suspend = %v, or it stopped again", err)
	}
	srv.SetState("parker", "archived", "")
	h2, err := p.Resume(ctx, h)
	if err != nil || h2.Name != "parker" {
		t.Fatalf("Resume an archived sandbox = %v, %v", h2, err)
	}
	// Resume waited for "started": the toolbox answers at once.
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "cat", Args: []string{file}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "memory" {
		t.Fatalf("after Resume: %q, %v", res.Output, err)
	}
	if err := p.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	srv.Inject("POST", "/start", 1, daytonatest.Fault{Status: 409})
	_, err = p.Resume(ctx, h)
	var un *sandbox.UnavailableError
	if !errors.As(err, &un) || un.HTTP == nil || un.HTTP.Status != 409 {
		t.Fatalf("Resume on start 409 = %v, want Unavailable{http 409}", err)
	}
	if _, err := p.Resume(ctx, sandbox.BuildHandle(daytona.Name, "never-made")); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Resume missing = %v", err)
	}
}

func TestListAllNames(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.PageSize = 3 })
	want := map[string]bool{}
	for i := range 8 {
		n := fmt.Sprintf("list-%d", i)
		mustCreate(t, p, n)
		want[n] = true
	}
	names, err := p.ListAllNames(ctxT(t))
	if err != nil || len(names) != len(want) {
		t.Fatalf("ListAllNames = %v, %v", names, err)
	}
	for _, n := range names {
		if !want[n] {
			t.Fatalf("unexpected %q", n)
		}
	}
	if got := countRequests(srv, "GET /api/sandbox"); got != 3 {
		t.Fatalf("%d list requests, want 3 pages", got)
	}
	// Past 40 pages the listing refuses rather than returning a part.
	srv.PageSize = 1
	for i := 8; i < 41; i++ {
		mustCreate(t, p, fmt.Sprintf("list-%d", i))
	}
	if names, err := p.ListAllNames(ctxT(t)); !errors.Is(err, sandbox.ErrTruncated) {
		t.Fatalf("41 pages: %d names, %v; want ErrTruncated", len(names), err)
	}
	srv.PageSize = 0
	srv.Inject("GET", "/api/sandbox", 1, daytonatest.Fault{Status: 503})
	if _, err := p.ListAllNames(ctxT(t)); sandbox.Kind(err) != "unavailable" {
		t.Fatalf("list on 503 = %v", err)
	}
}

func TestNetworkPolicy(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.EnforceDomains, c.DomainAllowListEnforced = true, true
	})
	h := mustCreate(t, p, "policed")
	ctx := ctxT(t)
	for _, tc := range []struct {
		allow []string
		want  string
	}{{nil, "blocked"}, {[]string{}, "blocked"}, {[]string{"api.example.com"}, "domains:api.example.com"},
		{[]string{"a.io", "b.io"}, "domains:a.io,b.io"}, {[]string{}, "blocked"}} {
		if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: tc.allow}); err != nil {
			t.Fatal(err)
		}
		if got := srv.Egress("policed"); got != tc.want {
			t.Fatalf("allow %q: egress %q, want %q", tc.allow, got, tc.want)
		}
		sb, _ := srv.Lookup("policed")
		if len(tc.allow) > 0 && sb.Policy["networkBlockAll"] == true {
			t.Fatalf("allow %q sent networkBlockAll true: %v", tc.allow, sb.Policy)
		}
	}
	before := len(srv.Requests())
	eleven := []string{"a.io", "b.io", "c.io", "d.io", "e.io", "f.io", "g.io", "h.io", "i.io", "j.io", "k.io"}
	for _, bad := range [][]string{{"a,b"}, {"a.io", ""}, {"localhost"}, {"-x.io"}, {"x.i0"}, {"*.*.x.io"}, {"a b.io"}, eleven} {
		if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: bad}); sandbox.Kind(err) != "invalid" {
			t.Fatalf("allow %q = %v, want Invalid", bad, err)
		}
	}
	if len(srv.Requests()) != before {
		t.Fatalf("refused lists reached the server: %q", srv.Requests()[before:])
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: eleven[:10]}); err != nil {
		t.Fatalf("ten domains: %v", err)
	}
	if err := p.ApplyNetworkPolicy(ctx, sandbox.BuildHandle(daytona.Name, "gone"), sandbox.NetworkPolicy{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("policy on a missing sandbox = %v", err)
	}
}

// awkward are arguments a naive transport would mangle.
var awkward = []string{"it's", `"double" \back $HOME`, "new\nline\n", "\xff\xfe\x80 not utf-8", "  spaced  ", "", "é€😀"}

// The command line survives both daemons' /process/execute: v0.190.0's,
// which pipes it into the shell, and older ones', which split it on spaces
// without a shell.
func TestCommandLineReachesProcessIntact(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			commandLineReachesProcessIntact(t, split)
		})
	}
}

func commandLineReachesProcessIntact(t *testing.T, split bool) {
	_, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.SplitExecute = split })
	h := mustCreate(t, p, "argv")
	ctx := ctxT(t)
	cmd := sandbox.Cmd{Name: "printf", Args: append([]string{`[%s]`}, awkward...)}
	want := ""
	for _, a := range awkward {
		want += "[" + a + "]"
	}
	res, err := p.Exec(ctx, h, cmd, sandbox.ExecOptions{Env: []string{"Q=it's \"q\"\n\xff"}, Dir: "/"})
	if err != nil || res.ExitCode != 0 || string(res.Output) != want {
		t.Fatalf("Exec = %q (exit %d), %v; want %q", res.Output, res.ExitCode, err, want)
	}
	res, err = p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", `printf %s "$Q"; pwd`}},
		sandbox.ExecOptions{Env: []string{"Q=it's \"q\"\n\xff"}, Dir: "/"})
	if err != nil || string(res.Output) != "it's \"q\"\n\xff/\n" {
		t.Fatalf("env/dir: %q, %v", res.Output, err)
	}
	c, err := p.Spawn(ctx, h, cmd, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, _, term := collect(t, c)
	if term.Kind != sandbox.Exit || term.Code != 0 || string(out) != want {
		t.Fatalf("Spawn: %q, %v %d; want %q", out, term.Kind, term.Code, want)
	}
	sessions, err := p.ListSessions(ctx, h)
	if err != nil || len(sessions) != 1 || sessions[0].Command != cmd.String() || sessions[0].ID != c.SessionID {
		t.Fatalf("ListSessions = %+v, %v; want the command line %q", sessions, err, cmd.String())
	}
}

func TestStdinEOFDrainsEarlierWrites(t *testing.T) {
	_, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "stdin")
	ctx := ctxT(t)
	for i := range 3 {
		c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		// No waiting between the writes and the close: the EOF must not
		// overtake them.
		for _, w := range []string{"a", "b\n", "c"} {
			if err := c.WriteStdin(ctx, []byte(w)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.CloseStdin(ctx); err != nil {
			t.Fatal(err)
		}
		out, _, term := collect(t, c)
		if string(out) != "ab\nc" || term.Kind != sandbox.Exit || term.Code != 0 {
			t.Fatalf("round %d: %q, %v %d", i, out, term.Kind, term.Code)
		}
		if err := c.CloseStdin(ctx); err != nil {
			t.Fatalf("CloseStdin after exit = %v", err)
		}
	}
	// A large write is chunked and arrives whole.
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "wc", Args: []string{"-c"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, bytes.Repeat([]byte{0, 0xff, 'x'}, 40000)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if out, _, term := collect(t, c); strings.TrimSpace(string(out)) != "120000" || term.Code != 0 {
		t.Fatalf("large write: %q, %d", out, term.Code)
	}
	// Without stdin, a write is refused rather than lost.
	c, err = p.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"5"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	var wf *sandbox.WriteFailedError
	if err := c.WriteStdin(ctx, []byte("x")); !errors.As(err, &wf) {
		t.Fatalf("WriteStdin without stdin = %v", err)
	}
}

func TestCommandWithoutStateIsTotal(t *testing.T) {
	_, p := fakeProvider(t, nil)
	ctx := ctxT(t)
	for _, c := range []*sandbox.Command{nil, {Provider: daytona.Name, Ref: "r"}, {Provider: daytona.Name, Private: "junk"}, {Provider: "other"}} {
		if err := p.WriteStdin(ctx, c, []byte("x")); sandbox.Kind(err) != "invalid" {
			t.Errorf("WriteStdin(%v) = %v", c, err)
		}
		if err := p.CloseStdin(ctx, c); sandbox.Kind(err) != "invalid" {
			t.Errorf("CloseStdin(%v) = %v", c, err)
		}
		if err := p.StopCommand(c); err != nil {
			t.Errorf("StopCommand(%v) = %v", c, err)
		}
	}
}

// TestLogStreamThroughFaults spawns a command whose output crosses polls
// (multi-byte characters, stderr, pauses) while the endpoint the polls use
// answers 429, 503, stalls, cut bodies and short answers: what arrives is
// exactly what the command wrote, each byte once.
func TestLogStreamThroughFaults(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "faulty")
	script := `for i in 1 2 3 4 5 6; do printf 'é%s€' $i; printf '😀%s' $i >&2; sleep 0.05; done; printf '\377end'`
	var wantOut, wantErr string
	for i := 1; i <= 6; i++ {
		wantOut += fmt.Sprintf("é%d€", i)
		wantErr += fmt.Sprintf("😀%d", i)
	}
	wantOut += "\xffend"
	srv.Inject("POST", "/process/execute", 2, daytonatest.Fault{Status: 429, Body: `{"retryAfter":1}`})
	srv.Inject("POST", "/process/execute", 2, daytonatest.Fault{Status: 503})
	srv.Inject("POST", "/process/execute", 3, daytonatest.Fault{Truncate: true})
	srv.Inject("POST", "/process/execute", 3, daytonatest.Fault{Short: true})
	srv.Inject("POST", "/process/execute", 1, daytonatest.Fault{Stall: 100 * time.Millisecond})
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, term := collect(t, c)
	if string(out) != wantOut || string(errs) != wantErr || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("got out %q err %q %v %d; want %q %q", out, errs, term.Kind, term.Code, wantOut, wantErr)
	}
	// An attach replays the same bytes from zero, through more faults.
	a, err := p.Attach(ctxT(t), h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Inject("POST", "/process/execute", 2, daytonatest.Fault{Short: true})
	out, errs, term = collect(t, a)
	if string(out) != wantOut || string(errs) != wantErr || term.Code != 0 {
		t.Fatalf("attach: out %q err %q %v %d", out, errs, term.Kind, term.Code)
	}
}

func TestLogStreamUnreachableIsAnError(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "unreachable")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi; sleep 20"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Inject("POST", "/process/execute", -1, daytonatest.Fault{Status: 502})
	_, _, term := collect(t, c)
	var un *sandbox.UnavailableError
	if term.Kind != sandbox.Error || !errors.As(term.Err, &un) || un.Reason != "log_stream_unreachable" {
		t.Fatalf("terminal %v %v, want Error log_stream_unreachable", term.Kind, term.Err)
	}
	if err := p.Destroy(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
}

func TestOlderDaemonShapes(t *testing.T) {
	_, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) {
		s.LegacyLogs, s.RecordExitCodes, s.ProxyURLInRecord, s.SplitExecute = true, true, false, true
	})
	h := mustCreate(t, p, "legacy")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo out; echo err >&2; exit 7"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, term := collect(t, c)
	if string(out) != "out\n" || string(errs) != "err\n" || term.Kind != sandbox.Exit || term.Code != 7 {
		t.Fatalf("legacy: %q %q %v %d", out, errs, term.Kind, term.Code)
	}
}

func TestAuthAndRateLimits(t *testing.T) {
	srv, _ := fakeProvider(t, nil)
	bad, err := daytona.New(daytona.Config{APIKey: "wrong", APIURL: srv.URL, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	var de *sandbox.DeniedError
	if _, err := bad.Get(ctxT(t), sandbox.BuildHandle(daytona.Name, "x")); !errors.As(err, &de) {
		t.Fatalf("wrong key = %v, want Denied", err)
	}
	_, p := fakeProvider(t, nil)
	srv2, p2 := fakeProvider(t, nil)
	_ = p
	h := mustCreate(t, p2, "limited")
	srv2.Inject("GET", "/api/sandbox/limited", 1, daytonatest.Fault{Status: 429, Body: `{"retryAfter":3}`})
	var rl *sandbox.RateLimitedError
	if _, err := p2.Get(ctxT(t), h); !errors.As(err, &rl) || rl.RetryAfter != 3*time.Second {
		t.Fatalf("429 = %v, want RateLimited 3s", err)
	}
	srv2.Inject("GET", "/api/sandbox/limited", 1, daytonatest.Fault{Status: 403})
	if _, err := p2.Get(ctxT(t), h); !errors.As(err, &de) {
		t.Fatalf("403 = %v", err)
	}
	srv2.Inject("GET", "/api/sandbox/limited", 1, daytonatest.Fault{Stall: 2 * time.Second})
	quick, _ := daytona.New(daytona.Config{APIKey: srv2.APIKey, APIURL: srv2.URL, HTTPClient: srv2.Client(), Timeout: 100 * time.Millisecond})
	var un *sandbox.UnavailableError
	if _, err := quick.Get(ctxT(t), h); !errors.As(err, &un) || un.Reason != sandbox.ReasonTimeout {
		t.Fatalf("stalled GET = %v, want Unavailable{timeout}", err)
	}
}

func TestConfig(t *testing.T) {
	t.Setenv(daytona.EnvAPIKey, "")
	if _, err := daytona.NewFromEnv(); err == nil || !strings.Contains(err.Error(), "DAYTONA_API_KEY") {
		t.Fatalf("NewFromEnv without a key = %v", err)
	}
	if _, err := daytona.New(daytona.Config{}); !errors.Is(err, daytona.ErrNoAPIKey) {
		t.Fatalf("New without a key = %v", err)
	}
	t.Setenv(daytona.EnvAPIKey, " k ")
	t.Setenv(daytona.EnvAPIURL, "https://daytona.internal/api")
	t.Setenv(daytona.EnvSnapshot, "snap")
	t.Setenv(daytona.EnvDomainAllowListEnforced, "")
	cfg, err := daytona.ConfigFromEnv()
	if err != nil || cfg.APIKey != "k" || cfg.APIURL != "https://daytona.internal/api" || cfg.Snapshot != "snap" || cfg.DomainAllowListEnforced {
		t.Fatalf("ConfigFromEnv = %+v, %v", cfg, err)
	}
	t.Setenv(daytona.EnvDomainAllowListEnforced, " TRUE ")
	if cfg, _ := daytona.ConfigFromEnv(); !cfg.DomainAllowListEnforced {
		t.Fatalf("%s=TRUE not read", daytona.EnvDomainAllowListEnforced)
	}
	if p, err := daytona.NewFromEnv(); err != nil || p.Name() != "daytona" {
		t.Fatalf("NewFromEnv = %v, %v", p, err)
	}
}

func TestStartWaitsForAStoppingSandbox(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.StopDelay = 300 * time.Millisecond })
	h := mustCreate(t, p, "slowstop")
	if err := p.Suspend(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	if sb, _ := srv.Lookup("slowstop"); sb.State != "stopped" {
		t.Fatalf("state %q", sb.State)
	}
	// Still "stopping": start would answer 409, so ensure-started waits.
	res, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "echo", Args: []string{"up"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "up\n" {
		t.Fatalf("Exec on a stopping sandbox = %q, %v", res.Output, err)
	}
	if countRequests(srv, "POST /api/sandbox/slowstop/start") != 1 {
		t.Fatalf("want one start: %q", srv.Requests())
	}
}

func TestSessionsAndAttachEdges(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	ctx := ctxT(t)
	missing := sandbox.BuildHandle(daytona.Name, "missing")
	if _, err := p.Spawn(ctx, missing, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Spawn on a missing sandbox = %v", err)
	}
	h := mustCreate(t, p, "edges")
	sb, _ := srv.Lookup("edges")
	// A session nobody ran a command in, and one that is not ours.
	for _, id := range []string{"managoat-empty", "someone-else"} {
		req, _ := http.NewRequest("POST", strings.TrimSuffix(srv.URL, "/api")+"/toolbox/"+sb.ID+"/process/session",
			strings.NewReader(`{"sessionId":"`+id+`"}`))
		req.Header.Set("Authorization", "Bearer "+srv.APIKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || ss[0].ID != "managoat-empty" || ss[0].Command != "" {
		t.Fatalf("ListSessions = %+v, %v", ss, err)
	}
	if _, err := p.Attach(ctx, h, "managoat-empty", sandbox.AttachOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Attach to a session without a command = %v", err)
	}
	if _, err := p.Attach(ctx, h, "../x", sandbox.AttachOptions{}); sandbox.Kind(err) != "invalid" {
		t.Fatalf("Attach with a bad id = %v", err)
	}
	if _, err := sandbox.NewRegistry(p).PublicURL(ctx, h); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("PublicURL = %v", err)
	}
}

// A command spawned without stdin reads /dev/null: the daemon's wrapper
// gives an async session command a stdin held open until it ends
// (apps/daemon pkg/session/execute.go, inputPipeCommand), so a command
// left on it would wait forever instead of seeing EOF.
func TestSpawnWithoutStdinSeesEOF(t *testing.T) {
	_, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "nostdin")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "cat; echo eof"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, _, term := collect(t, c)
	if string(out) != "eof\n" || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("stdout %q terminal %v %d", out, term.Kind, term.Code)
	}
}
