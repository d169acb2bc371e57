package daytona_test

// Tests of the behaviours that broke against Daytona's real service
// (issue 21); each names the public source (release v0.190.0) that decided it.

import (
	"context"
	"encoding/json"
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

// The daemon strips the stream markers from a command's log unless the
// request asks for split output (apps/daemon pkg/session/common.go,
// IsCombinedOutput): without the header, stderr would arrive as stdout.
func TestSpawnKeepsStderrApart(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "split")
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo out; echo err >&2; echo out2"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, term := collect(t, c)
	if term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("terminal %v %d", term.Kind, term.Code)
	}
	if string(out) != "out\nout2\n" || string(errs) != "err\n" {
		t.Fatalf("stdout %q stderr %q; want %q and %q", out, errs, "out\nout2\n", "err\n")
	}
	// Attach replays the same split.
	ss, err := p.ListSessions(ctxT(t), h)
	if err != nil || len(ss) != 1 {
		t.Fatalf("ListSessions = %v, %v", ss, err)
	}
	a, err := p.Attach(ctxT(t), h, ss[0].ID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, _ = collect(t, a)
	if string(out) != "out\nout2\n" || string(errs) != "err\n" {
		t.Fatalf("attach: stdout %q stderr %q", out, errs)
	}
	_ = srv
}

// The current service uploads at POST /files/upload-v2 (the 0.218 toolbox
// client has no other single-file route); the public daemon at v0.190.0
// at POST /files/upload (apps/daemon pkg/toolbox/fs/upload_file.go) and
// has no upload-v2. The adapter tries v2, falls back once on the router's
// 404, and keeps to what worked; a 404 of the route it knows is not a
// missing sandbox.
func TestWriteFileOnBothGenerations(t *testing.T) {
	for _, gen := range []daytonatest.Generation{daytonatest.Current, daytonatest.Daemon0190} {
		t.Run(gen.String(), func(t *testing.T) {
			srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.Generation = gen })
			h := mustCreate(t, p, "files")
			ctx := ctxT(t)
			route := "/files/upload-v2"
			if gen == daytonatest.Daemon0190 {
				route = "/files/upload"
			}
			uploads := func() (v2, v1 int) {
				for _, r := range srv.Requests() {
					switch {
					case strings.HasSuffix(r, "/files/upload-v2"):
						v2++
					case strings.HasSuffix(r, "/files/upload"):
						v1++
					}
				}
				return v2, v1
			}
			for i, name := range []string{"notes/a.txt", "notes/a2.txt", "notes/a3.txt"} {
				if err := p.WriteFile(ctx, h, name, []byte("hello\x00\xff"), sandbox.WriteFileOptions{}); err != nil {
					t.Fatalf("WriteFile %s: %v", name, err)
				}
				got, err := p.ReadFile(ctx, h, name)
				if err != nil || string(got) != "hello\x00\xff" {
					t.Fatalf("ReadFile = %q, %v", got, err)
				}
				v2, v1 := uploads()
				// Current: one v2 per write. The daemon: v2 once (404), then
				// /files/upload for every write — the choice is made once.
				want2, want1 := i+1, 0
				if gen == daytonatest.Daemon0190 {
					want2, want1 = 1, i+1
				}
				if v2 != want2 || v1 != want1 {
					t.Fatalf("after %d writes: %d upload-v2 and %d upload requests, want %d and %d: %q", i+1, v2, v1, want2, want1, srv.Requests())
				}
			}
			// A 404 from the known upload route of a sandbox that exists is
			// not ErrNotFound, and is not taken as a reason to switch routes.
			srv.Inject("POST", route, 1, daytonatest.Fault{Status: http.StatusNotFound, Body: `404 page not found`})
			v2Before, v1Before := uploads()
			err := p.WriteFile(ctx, h, "notes/b.txt", []byte("x"), sandbox.WriteFileOptions{})
			if err == nil || errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("WriteFile after a route 404 = %v, want an error that is not ErrNotFound", err)
			}
			if v2, v1 := uploads(); v2+v1 != v2Before+v1Before+1 {
				t.Fatalf("a 404 of the known route made %d upload requests, want 1", v2+v1-v2Before-v1Before)
			}
			// The same 404 for a sandbox deleted meanwhile is ErrNotFound.
			srv.Inject("POST", route, 1, daytonatest.Fault{Status: http.StatusNotFound, Stall: 300 * time.Millisecond})
			deleted := make(chan struct{})
			defer func() { <-deleted }()
			go func() {
				defer close(deleted)
				time.Sleep(50 * time.Millisecond)
				req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/sandbox/files", nil)
				req.Header.Set("Authorization", "Bearer "+srv.APIKey)
				if r, err := srv.Client().Do(req); err == nil {
					r.Body.Close()
				}
			}()
			if err := p.WriteFile(ctx, h, "c.txt", []byte("x"), sandbox.WriteFileOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("WriteFile to a sandbox deleted meanwhile = %v, want ErrNotFound", err)
			}
		})
	}
}

// deleteWhenSeen deletes the named sandbox straight through the API as
// soon as a request whose "METHOD path" contains substr has reached the
// server (a stall injected there holds it meanwhile); the returned
// function waits for the deletion.
func deleteWhenSeen(t *testing.T, srv *daytonatest.Server, name, substr string) (wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if strings.Contains(strings.Join(srv.Requests(), "\n"), substr) {
				break
			}
		}
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/sandbox/"+name, nil)
		req.Header.Set("Authorization", "Bearer "+srv.APIKey)
		if r, err := srv.Client().Do(req); err == nil {
			r.Body.Close()
		}
	}()
	return func() { <-done }
}

// The toolbox proxy checks the bearer's access to the sandbox before
// anything else, and answers 401 for one that no longer exists (apps/proxy
// pkg/proxy/auth.go, Authenticate): a sandbox deleted under an operation is
// ErrNotFound, confirmed by a GET, not Denied.
func TestToolboxRefusalOfADeletedSandboxIsNotFound(t *testing.T) {
	for _, op := range []struct {
		name, route string
		run         func(p *daytona.Provider, h *sandbox.Handle) error
	}{
		{"exec", "/process/execute", func(p *daytona.Provider, h *sandbox.Handle) error {
			_, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{})
			return err
		}},
		{"spawn", "/process/session", func(p *daytona.Provider, h *sandbox.Handle) error {
			c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
			if err == nil {
				_ = c.Stop()
			}
			return err
		}},
		{"write", "/files/upload", func(p *daytona.Provider, h *sandbox.Handle) error {
			return p.WriteFile(ctxT(t), h, "a.txt", []byte("x"), sandbox.WriteFileOptions{})
		}},
		{"read", "/files/download", func(p *daytona.Provider, h *sandbox.Handle) error {
			_, err := p.ReadFile(ctxT(t), h, "a.txt")
			return err
		}},
		{"sessions", "/process/session", func(p *daytona.Provider, h *sandbox.Handle) error {
			_, err := p.ListSessions(ctxT(t), h)
			return err
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			srv, p := fakeProvider(t, nil)
			h := mustCreate(t, p, "vanishing")
			srv.Inject("", op.route, 1, daytonatest.Fault{Stall: 500 * time.Millisecond})
			wait := deleteWhenSeen(t, srv, h.Name, op.route)
			err := op.run(p, h)
			wait()
			if !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("%s on a sandbox deleted meanwhile = %v, want ErrNotFound", op.name, err)
			}
		})
	}
	// The same refusal of a sandbox that is still there stands.
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "still-here")
	for _, st := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		srv.Inject("POST", "/process/execute", 1, daytonatest.Fault{Status: st})
		var de *sandbox.DeniedError
		if _, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); !errors.As(err, &de) {
			t.Fatalf("a toolbox %d for a sandbox that exists = %v, want Denied", st, err)
		}
	}
}

// /process/execute runs as long as its timeout field says (apps/daemon
// pkg/toolbox/process/execute.go; 408 on its own timeout): the HTTP request
// must not be cut by the per-request timeout first.
func TestExecLongerThanTheRequestTimeout(t *testing.T) {
	_, p := fakeProvider(t, func(_ *daytonatest.Server, c *daytona.Config) { c.Timeout = 500 * time.Millisecond })
	h := mustCreate(t, p, "slow")
	res, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 1.5; echo done"}}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || res.ExitCode != 0 || string(res.Output) != "done\n" {
		t.Fatalf("Exec = %q %d, %v", res.Output, res.ExitCode, err)
	}
	// Without a budget (and a context without a deadline) the call is
	// bounded by the caller's context only.
	nodl, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err = p.Exec(nodl, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 1; echo done"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "done\n" {
		t.Fatalf("Exec without a budget = %q %d, %v", res.Output, res.ExitCode, err)
	}
	// The daemon's own timeout (408) is the exec's timeout.
	_, err = p.Exec(ctxT(t), h, sandbox.Cmd{Name: "sleep", Args: []string{"5"}}, sandbox.ExecOptions{Timeout: 1 * time.Second})
	if !sandbox.IsExecTimeout(err) {
		t.Fatalf("Exec past its budget = %v", err)
	}
}

// networkBlockAll wins over every list on the runner (apps/runner
// pkg/docker/network.go), and the public-source runner never reads
// domainAllowList: an allow-list must be sent without block-all, and refused
// where nobody enforces it.
func TestDomainAllowListIsEnforcedOrRefused(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.EnforceDomains = true
		c.DomainAllowListEnforced = true
	})
	h := mustCreate(t, p, "egress")
	ctx := ctxT(t)
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatal(err)
	}
	if e := srv.Egress("egress"); e != "blocked" {
		t.Fatalf("Allow: [] gives egress %q, want blocked", e)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", "*.example.org"}}); err != nil {
		t.Fatal(err)
	}
	if e := srv.Egress("egress"); e != "domains:api.example.com,*.example.org" {
		t.Fatalf("an allow-list gives egress %q", e)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{}); err != nil {
		t.Fatal(err)
	}
	if e := srv.Egress("egress"); e != "blocked" {
		t.Fatalf("back to deny-all gives egress %q", e)
	}
	// The list always travelled alone: never beside networkBlockAll true,
	// which would win over it on the runner.
	sb, _ := srv.Lookup("egress")
	for _, body := range sb.Policies {
		if l, _ := body["domainAllowList"].(string); l != "" && body["networkBlockAll"] != nil {
			t.Fatalf("the allow-list was sent with networkBlockAll: %v", body)
		}
	}
	// An answer that does not echo the list (the API kept something else)
	// is an error, and block-all is not lifted after it.
	srv.Inject("POST", "/network-settings", 1, daytonatest.Fault{Status: http.StatusOK,
		Body: `{"id":"x","name":"egress","networkBlockAll":true}`})
	err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}})
	var pe *sandbox.ProviderError
	if !errors.As(err, &pe) || pe.Reason != "policy_not_applied" {
		t.Fatalf("an answer without the list = %v, want ProviderError policy_not_applied", err)
	}
	if e := srv.Egress("egress"); e != "blocked" {
		t.Fatalf("after an unconfirmed list egress is %q, want blocked", e)
	}

	// A server whose runners ignore the list: refused, and the sandbox's
	// egress is left as it was (blocked), never opened.
	srv2, p2 := fakeProvider(t, nil)
	h2 := mustCreate(t, p2, "public-runner")
	if err := p2.ApplyNetworkPolicy(ctx, h2, sandbox.NetworkPolicy{}); err != nil {
		t.Fatal(err)
	}
	err = p2.ApplyNetworkPolicy(ctx, h2, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}})
	if sandbox.Kind(err) != "invalid" && !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("allow-list where it is not enforced = %v, want a refusal", err)
	}
	if e := srv2.Egress("public-runner"); e != "blocked" {
		t.Fatalf("after the refusal egress is %q, want blocked", e)
	}
}

// POST /sandbox and POST …/start hold the request up to 30 s while the
// sandbox starts (apps/api sandbox.controller.ts, waitForSandboxStarted):
// a per-request timeout shorter than the hold fails a create that works.
func TestCreateAndStartOutlastTheServersHold(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.StartDelay, s.Hold = 700*time.Millisecond, 2*time.Second
		c.Timeout = 300 * time.Millisecond
	})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "held", sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create held by the server: %v", err)
	}
	if err := p.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Resume(ctx, h); err != nil {
		t.Fatalf("Resume held by the server: %v", err)
	}
	if info, err := p.Get(ctx, h); err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get = %v, %v", info.Status, err)
	}
	_ = srv
}

// DELETE answers 409 while a state change is in progress (sandbox.service.ts
// destroy, StateChangeInProgressError): nothing is being deleted, so Destroy
// waits and deletes again rather than wait for a 404 that never comes.
func TestDestroyRetriesAStateChangeInProgress(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.StartDelay, s.Hold = 800*time.Millisecond, time.Millisecond
		c.Timeout = 400 * time.Millisecond
	})
	ctx := ctxT(t)
	h := mustCreate(t, p, "busy") // answered while still "starting"
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatalf("Destroy during a start: %v", err)
	}
	if _, err := p.Get(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get after Destroy = %v", err)
	}
	if n := countRequests(srv, "DELETE /api/sandbox/busy"); n < 2 {
		t.Fatalf("%d DELETEs; the first met a 409 and must have been repeated", n)
	}
}

// A deleted sandbox is renamed DESTROYED_<name>_<ms> with desiredState
// destroyed at once, keeps its state until the runner begins (only
// "pending" is set), then is "destroying"; it stays listed throughout
// (sandbox.entity.ts getSoftDeleteUpdate; the search,
// sandbox-typeorm-search.adapter.ts, leaves out only state destroyed).
func TestListAllNamesSkipsSoftDeleted(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) {
		s.DestroyPending, s.DestroyDelay = time.Hour, time.Hour
	})
	ctx := ctxT(t)
	mustCreate(t, p, "keep")
	gone := mustCreate(t, p, "gone")
	if err := p.Destroy(ctx, gone); err != nil {
		t.Fatal(err)
	}
	for _, phase := range []string{"started", "destroying"} {
		if phase == "destroying" {
			srv.DestroyPending = 0
		}
		names, err := p.ListAllNames(ctx)
		if err != nil || len(names) != 1 || names[0] != "keep" {
			t.Fatalf("%s: ListAllNames = %q, %v; want [keep]", phase, names, err)
		}
	}
	// The name is free again at once.
	mustCreate(t, p, "gone")
}

// The daemon's wrapper labels session output line by line with a shell
// read loop (apps/daemon pkg/session/execute.go, cmdWrapperFormat): a
// prompt without a newline would show only when its line ends, a final
// line would gain a newline and NUL bytes would vanish. Spawn's output must
// be the command's bytes, exactly and without waiting for a newline.
func TestSpawnOutputIsByteExact(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "exact")
	ctx := ctxT(t)
	script := `printf 'prompt> '; read x; printf 'got %s' "$x"; printf 'a\000b\r' >&2`
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	deadline := time.After(10 * time.Second)
	for string(out) != "prompt> " {
		select {
		case ev := <-c.Events():
			if ev.Kind != sandbox.Stdout {
				t.Fatalf("event %v before the prompt (stdout %q)", ev.Kind, out)
			}
			out = append(out, ev.Data...)
		case <-deadline:
			_ = c.Stop()
			t.Fatalf("the prompt %q never arrived (stdout %q)", "prompt> ", out)
		}
	}
	if err := p.WriteStdin(ctx, c, []byte("yes\n")); err != nil {
		t.Fatal(err)
	}
	rest, errs, term := collect(t, c)
	if got := string(out) + string(rest); got != "prompt> got yes" || string(errs) != "a\x00b\r" || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("stdout %q stderr %q terminal %v %d", got, errs, term.Kind, term.Code)
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || ss[0].Command != (sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}).String() {
		t.Fatalf("ListSessions = %+v, %v", ss, err)
	}
	a, err := p.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all, errs, term := collect(t, a)
	if string(all) != "prompt> got yes" || string(errs) != "a\x00b\r" || term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("attach: stdout %q stderr %q terminal %v %d", all, errs, term.Kind, term.Code)
	}
	_ = srv
}

// oldSession starts, straight through the toolbox, a session command the
// way an older adapter's shim left it: output only in the daemon's log.
func oldSession(t *testing.T, srv *daytonatest.Server, name, sid, script string) {
	t.Helper()
	sb, ok := srv.Lookup(name)
	if !ok {
		t.Fatalf("no sandbox %q", name)
	}
	tb := strings.TrimSuffix(srv.URL, "/api") + "/toolbox/" + sb.ID
	for _, rq := range []struct{ url, body string }{
		{tb + "/process/session", `{"sessionId":"` + sid + `"}`},
		{tb + "/process/session/" + sid + "/exec", `{"command":` + strconvQuote(script) + `,"runAsync":true}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, rq.url, strings.NewReader(rq.body))
		req.Header.Set("Authorization", "Bearer "+srv.APIKey)
		req.Header.Set("Content-Type", "application/json")
		r, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode >= 300 {
			t.Fatalf("%s: %d", rq.url, r.StatusCode)
		}
	}
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// Attach to a session an older shim left (output only in the daemon's log)
// reads the log, asking for split output (daemon pkg/session/common.go,
// IsCombinedOutput): stderr stays stderr.
func TestAttachToAnOlderSessionKeepsStderrApart(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.RecordExitCodes = true })
	h := mustCreate(t, p, "older")
	oldSession(t, srv, "older", "managoat-0ld", `sh -c 'echo out; echo err >&2; exit 3'`)
	a, err := p.Attach(ctxT(t), h, "managoat-0ld", sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, term := collect(t, a)
	if string(out) != "out\n" || string(errs) != "err\n" || term.Kind != sandbox.Exit || term.Code != 3 {
		t.Fatalf("stdout %q stderr %q terminal %v %d", out, errs, term.Kind, term.Code)
	}
}

// Every toolbox session holds a shell in the sandbox (apps/daemon
// pkg/session/create.go); a finished spawn's session is deleted once its
// output is drained, and the session stays listable and replayable from
// the shim's files.
func TestFinishedSessionsAreDeleted(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "tidy")
	ctx := ctxT(t)
	cmd := sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi; exit 4"}}
	c, err := p.Spawn(ctx, h, cmd, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, term := collect(t, c); term.Code != 4 {
		t.Fatalf("terminal %v %d", term.Kind, term.Code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for srv.Sessions("tidy") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d daemon sessions left after the command finished", srv.Sessions("tidy"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || ss[0].ID != c.SessionID || ss[0].Command != cmd.String() {
		t.Fatalf("ListSessions = %+v, %v", ss, err)
	}
	a, err := p.Attach(ctx, h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, term := collect(t, a); string(out) != "hi\n" || term.Kind != sandbox.Exit || term.Code != 4 {
		t.Fatalf("attach: %q %v %d", out, term.Kind, term.Code)
	}
}

// resizing, snapshotting, forking and unknown are passing states
// (apps/api enums/sandbox-state.enum.ts); the toolbox is not served
// meanwhile, so an operation waits for the sandbox to settle rather than
// fail. pending_archive is not a state at all.
func TestTransientStatesAreWaitedOut(t *testing.T) {
	for _, st := range []string{"resizing", "snapshotting", "forking", "unknown"} {
		t.Run(st, func(t *testing.T) {
			srv, p := fakeProvider(t, nil)
			h := mustCreate(t, p, "busy-"+st)
			srv.SetState(h.Name, st, "")
			go func() {
				time.Sleep(300 * time.Millisecond)
				srv.SetState(h.Name, "started", "")
			}()
			res, err := p.Exec(ctxT(t), h, sandbox.Cmd{Name: "echo", Args: []string{"ok"}}, sandbox.ExecOptions{})
			if err != nil || string(res.Output) != "ok\n" {
				t.Fatalf("Exec while %s = %q, %v", st, res.Output, err)
			}
		})
	}
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "not-a-state")
	srv.SetState(h.Name, "pending_archive", "")
	if info, err := p.Get(ctxT(t), h); err != nil || info.Status != sandbox.StatusUnknown {
		t.Fatalf("Get of pending_archive = %v, %v; want unknown", info.Status, err)
	}
}

// 429s carry one Retry-After-<throttler> header per throttler that
// refused (apps/docs limits.mdx; NestJS named throttlers), not a body field.
func TestRateLimitReadsTheThrottlersHeaders(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "throttled")
	srv.Inject("GET", "/api/sandbox/throttled", 1, daytonatest.Fault{Status: 429,
		Body:   `{"statusCode":429,"message":"ThrottlerException: Too Many Requests"}`,
		Header: http.Header{"Retry-After-Authenticated": {"4"}, "Retry-After-Sandbox-Lifecycle": {"9"}, "X-Ratelimit-Remaining-Authenticated": {"0"}}})
	var rl *sandbox.RateLimitedError
	if _, err := p.Get(ctxT(t), h); !errors.As(err, &rl) || rl.RetryAfter != 9*time.Second {
		t.Fatalf("429 = %v, want RateLimited 9s (the longest throttler)", err)
	}
}

// The toolbox proxy URL is per region (apps/api sandbox.service.ts,
// resolveToolboxProxyUrl by the sandbox's region): one learned for a
// sandbox in one region must not serve a sandbox in another.
func TestToolboxProxyIsPerRegion(t *testing.T) {
	srv, p := fakeProvider(t, func(s *daytonatest.Server, _ *daytona.Config) { s.ProxyURLInRecord = false })
	ctx := ctxT(t)
	us := mustCreate(t, p, "in-us")
	srv.Target = "eu"
	eu := mustCreate(t, p, "in-eu")
	for _, h := range []*sandbox.Handle{us, eu, us} {
		res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{h.Name}}, sandbox.ExecOptions{})
		if err != nil || string(res.Output) != h.Name+"\n" {
			t.Fatalf("Exec in %s = %q, %v", h.Name, res.Output, err)
		}
	}
	if n := countRequests(srv, "GET /api/sandbox/") - countRequests(srv, "GET /api/sandbox/in-"); n != 2 {
		t.Fatalf("%d toolbox-proxy-url lookups, want one per region", n)
	}
}

// Names the API refuses (IsSafeDisplayString: "www." anywhere, any case)
// or cannot route (GET /sandbox/paginated and /sandbox/for-runner are
// other endpoints, sandbox.controller.ts) are refused before any request.
func TestNamesTheServerRefusesAreCheckedFirst(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	ctx := ctxT(t)
	for _, name := range []string{"paginated", "Paginated", "for-runner", "www.example", "my-WWW.site"} {
		before := len(srv.Requests())
		if _, err := p.Create(ctx, name, sandbox.CreateOptions{}); sandbox.Kind(err) != "invalid" {
			t.Errorf("Create(%q) = %v, want Invalid", name, err)
		}
		if _, err := p.Get(ctx, sandbox.BuildHandle(daytona.Name, name)); sandbox.Kind(err) != "invalid" {
			t.Errorf("Get(%q) = %v, want Invalid", name, err)
		}
		if n := len(srv.Requests()) - before; n != 0 {
			t.Errorf("%q: %d requests sent", name, n)
		}
	}
	mustCreate(t, p, "paginated-not")
	mustCreate(t, p, "www-ok")
}

// A finished spawn nobody watched to its end (detached at once) loses its
// daemon session at the next ListSessions, and stays listed.
func TestUnwatchedFinishedSessionsAreDeletedByList(t *testing.T) {
	srv, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "unwatched")
	ctx := ctxT(t)
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"0.3"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ss, err := p.ListSessions(ctx, h)
		if err != nil || len(ss) != 1 || ss[0].ID != c.SessionID {
			t.Fatalf("ListSessions = %+v, %v", ss, err)
		}
		if srv.Sessions("unwatched") == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished session's shell is still there")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Output larger than one read (readChunk, 512 KiB a stream) arrives whole,
// each byte once, before the verdict.
func TestLargeSpawnOutputIsWhole(t *testing.T) {
	_, p := fakeProvider(t, nil)
	h := mustCreate(t, p, "large")
	// 1.5 MiB of a counting pattern on stdout, 600 KiB on stderr.
	script := `i=0; while [ $i -lt 24576 ]; do printf '%063d\n' $i; i=$((i+1)); done; head -c 614400 /dev/zero >&2; exit 5`
	c, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, errs, term := collect(t, c)
	if term.Kind != sandbox.Exit || term.Code != 5 {
		t.Fatalf("terminal %v %d", term.Kind, term.Code)
	}
	if len(out) != 24576*64 || len(errs) != 614400 {
		t.Fatalf("got %d stdout and %d stderr bytes", len(out), len(errs))
	}
	for i := 0; i < 24576; i++ {
		if want := fmt.Sprintf("%063d\n", i); string(out[i*64:(i+1)*64]) != want {
			t.Fatalf("line %d is %q", i, out[i*64:(i+1)*64])
		}
	}
}
