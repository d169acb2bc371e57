package sandboxtest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

func isInvalid(err error) bool {
	var iv *sandbox.InvalidError
	return errors.As(err, &iv)
}

// noPanic runs f and fails t if it panics.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", what, r)
		}
	}()
	f()
}

func (s *suite) identity(t *testing.T) {
	t.Run("BuildHandleIsPure", func(t *testing.T) { // test 1
		name := s.cfg.names()
		h := sandbox.BuildHandle(s.p.Name(), name)
		if h.Provider != s.p.Name() || h.Name != name {
			t.Fatalf("BuildHandle = %v", h)
		}
	})
	t.Run("CapabilitiesAreKnown", func(t *testing.T) { // test 2
		for _, c := range s.p.Capabilities() {
			if !c.IsKnown() {
				t.Errorf("unknown capability %q", c)
			}
		}
	})
	t.Run("CapabilitiesMatchInterfaces", func(t *testing.T) {
		_, cn := s.p.(sandbox.CreateNewer)
		_, od := s.p.(sandbox.OnceDestroyer)
		_, co := s.p.(sandbox.CheckpointOnceCreator)
		_, st := s.p.(sandbox.SessionTerminator)
		_, cp := s.p.(sandbox.Checkpointer)
		_, pu := s.p.(sandbox.PublicURLer)
		for c, impl := range map[sandbox.Capability]bool{
			sandbox.CapCreateNew: cn, sandbox.CapDestroyOnce: od,
			sandbox.CapCreateCheckpointOnce: co, sandbox.CapTerminateSession: st,
			sandbox.CapCheckpoint: cp, sandbox.CapPublicURL: pu,
		} {
			if s.has(c) && !impl {
				t.Errorf("advertises %q without implementing its interface", c)
			}
		}
		if s.has(sandbox.CapForceTerminateSession) && !s.has(sandbox.CapTerminateSession) {
			t.Errorf("advertises force_terminate_session without terminate_session")
		}
	})
	t.Run("PublicURLAgreesWithCapability", func(t *testing.T) { // test 3
		h := s.created(t)
		url, err := s.reg.PublicURL(s.ctx(t), h)
		switch {
		case err == nil:
			if !s.has(sandbox.CapPublicURL) {
				t.Errorf("returned URL %q without advertising public_url", url)
			}
			if !strings.HasPrefix(url, "http") {
				t.Errorf("URL %q does not start with http", url)
			}
		case errors.Is(err, sandbox.ErrNotSupported):
			if s.has(sandbox.CapPublicURL) {
				t.Errorf("advertises public_url but PublicURL is not supported")
			}
		case !s.has(sandbox.CapPublicURL):
			t.Errorf("PublicURL without public_url advertised = %v, want ErrNotSupported", err)
		case isInvalid(err):
			// This sandbox's options give it no URL (a provider whose URL
			// is a published port's): one created with a port must have one.
			ctx := s.ctx(t)
			h2, cerr := s.reg.Create(ctx, s.p.Name(), s.cfg.names(), sandbox.CreateOptions{Publish: []int{8080}})
			if cerr != nil {
				t.Fatalf("advertises public_url, PublicURL of a plain sandbox = %v, and a create publishing a port = %v", err, cerr)
			}
			s.cleanupDestroy(t, h2)
			if url, err := s.reg.PublicURL(ctx, h2); err != nil || !strings.HasPrefix(url, "http") {
				t.Errorf("advertises public_url, but PublicURL of a sandbox publishing a port = %q, %v", url, err)
			}
		default:
			t.Errorf("advertises public_url but PublicURL = %v", err)
		}
	})
	t.Run("BadInputIsInvalid", func(t *testing.T) {
		ctx := s.ctx(t)
		foreign := sandbox.BuildHandle(s.p.Name()+"-other", "x")
		for _, h := range []*sandbox.Handle{nil, foreign} {
			noPanic(t, "Get", func() {
				if _, err := s.p.Get(ctx, h); !isInvalid(err) {
					t.Errorf("Get(%v) = %v, want InvalidError", h, err)
				}
			})
			noPanic(t, "Destroy", func() {
				if err := s.p.Destroy(ctx, h); !isInvalid(err) {
					t.Errorf("Destroy(%v) = %v, want InvalidError", h, err)
				}
			})
			noPanic(t, "Exec", func() {
				if _, err := s.p.Exec(ctx, h, s.fx.ExecOK, sandbox.ExecOptions{}); !isInvalid(err) {
					t.Errorf("Exec(%v) = %v, want InvalidError", h, err)
				}
			})
			noPanic(t, "Spawn", func() {
				if c, err := s.p.Spawn(ctx, h, s.fx.SpawnOK, sandbox.SpawnOptions{}); !isInvalid(err) {
					t.Errorf("Spawn(%v) = %v, want InvalidError", h, err)
					if c != nil {
						_ = c.Stop()
					}
				}
			})
		}
		long := strings.Repeat("a", sandbox.MaxNameLen+1)
		for _, name := range []string{"", long, "a/b", "../x", "a\x00b", "has space", "a\nb"} {
			noPanic(t, "Create", func() {
				if _, err := s.reg.Create(ctx, s.p.Name(), name, sandbox.CreateOptions{}); !isInvalid(err) {
					t.Errorf("Create(%q) = %v, want InvalidError", name, err)
				}
			})
			noPanic(t, "provider Create", func() {
				h, err := s.p.Create(ctx, name, sandbox.CreateOptions{})
				if !isInvalid(err) {
					t.Errorf("provider Create(%q) = %v, want InvalidError", name, err)
					if err == nil {
						_ = s.p.Destroy(ctx, h)
					}
				}
			})
		}
		if _, err := s.reg.Create(ctx, "no-such-provider", "x", sandbox.CreateOptions{}); !isInvalid(err) ||
			!strings.Contains(err.Error(), s.p.Name()) {
			t.Errorf("unknown provider: %v, want InvalidError listing %q", err, s.p.Name())
		}
	})
}

func (s *suite) lifecycle(t *testing.T) {
	t.Run("CreateNewRefusesAdoption", func(t *testing.T) { // test 4
		s.require(t, sandbox.CapCreateNew)
		ctx, name := s.ctx(t), s.cfg.names()
		first, err := s.reg.CreateNew(ctx, s.p.Name(), name, sandbox.CreateNewOptions{})
		if err != nil {
			t.Fatalf("CreateNew: %v", err)
		}
		s.cleanupDestroy(t, first)
		if first.InstanceID == "" {
			t.Fatalf("CreateNew returned an empty InstanceID")
		}
		if _, err := s.reg.CreateNew(ctx, s.p.Name(), name, sandbox.CreateNewOptions{}); !errors.Is(err, sandbox.ErrAlreadyExists) && !isInvalid(err) {
			t.Fatalf("second CreateNew = %v, want ErrAlreadyExists or InvalidError", err)
		}
		if err := s.reg.Destroy(ctx, first); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		second, err := s.reg.CreateNew(ctx, s.p.Name(), name, sandbox.CreateNewOptions{})
		if err != nil {
			t.Fatalf("CreateNew after Destroy: %v", err)
		}
		s.cleanupDestroy(t, second)
		if second.InstanceID == first.InstanceID {
			t.Fatalf("same InstanceID %q after Destroy", first.InstanceID)
		}
	})
	t.Run("CreateNewOnAdoptedName", func(t *testing.T) {
		s.require(t, sandbox.CapCreateNew)
		h := s.created(t)
		if _, err := s.reg.CreateNew(s.ctx(t), s.p.Name(), h.Name, sandbox.CreateNewOptions{}); !errors.Is(err, sandbox.ErrAlreadyExists) && !isInvalid(err) {
			t.Fatalf("CreateNew on a name made by Create = %v, want ErrAlreadyExists", err)
		}
		if sandbox.Transient(sandbox.ErrAlreadyExists) {
			t.Fatalf("ErrAlreadyExists is transient")
		}
		if _, err := s.reg.Get(s.ctx(t), h); err != nil {
			t.Fatalf("Get after refused CreateNew: %v", err)
		}
	})
	t.Run("CreateNewRaceHasOneWinner", func(t *testing.T) {
		s.require(t, sandbox.CapCreateNew)
		ctx, name := s.ctx(t), s.cfg.names()
		var wg sync.WaitGroup
		hs := make([]*sandbox.Handle, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { hs[i], errs[i] = s.reg.CreateNew(ctx, s.p.Name(), name, sandbox.CreateNewOptions{}) })
		}
		wg.Wait()
		wins := 0
		for i := range 2 {
			if errs[i] == nil {
				wins++
				s.cleanupDestroy(t, hs[i])
			} else if !errors.Is(errs[i], sandbox.ErrAlreadyExists) && !isInvalid(errs[i]) {
				t.Errorf("loser's error = %v, want ErrAlreadyExists", errs[i])
			}
		}
		if wins != 1 {
			t.Fatalf("%d concurrent CreateNew calls won, want exactly 1 (errors %v)", wins, errs)
		}
	})
	t.Run("CreateAdopts", func(t *testing.T) { // test 5
		ctx, name := s.ctx(t), s.cfg.names()
		first, err := s.reg.Create(ctx, s.p.Name(), name, sandbox.CreateOptions{})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		s.cleanupDestroy(t, first)
		// Something of the first sandbox's own, to see the second Create
		// adopt it rather than make it anew: a file where the provider
		// writes files, else a detached session.
		marker := []byte("adopted-" + name)
		path := s.cfg.writeDir + "/managoat-adopt-" + name
		wrote := s.reg.WriteFile(ctx, first, path, marker, sandbox.WriteFileOptions{}) == nil
		if wrote {
			got, err := s.reg.ReadFile(ctx, first, path)
			wrote = err == nil && bytes.Equal(got, marker) // else a session shows it
		}
		var session string
		if !wrote {
			if !s.has(sandbox.CapAttach) {
				t.Fatalf("neither WriteFile nor attach: nothing of the first sandbox can be seen across the second Create")
			}
			o := s.cfg.spawnOpts
			o.Detachable = true
			c, err := s.reg.Spawn(ctx, first, s.fx.SpawnStay, o)
			if err != nil {
				t.Fatalf("Spawn: %v", err)
			}
			session = c.SessionID
			_ = c.Stop()
			if session == "" {
				t.Fatalf("a detachable spawn has no session id")
			}
		}
		second, err := s.reg.Create(ctx, s.p.Name(), name, sandbox.CreateOptions{})
		if err != nil {
			t.Fatalf("second Create: %v", err)
		}
		if first.Name != second.Name {
			t.Fatalf("names differ: %q, %q", first.Name, second.Name)
		}
		if _, err := s.reg.Get(ctx, second); err != nil {
			t.Fatalf("Get: %v", err)
		}
		if wrote {
			got, err := s.reg.ReadFile(ctx, second, path)
			if err != nil || !bytes.Equal(got, marker) {
				t.Fatalf("the file the first sandbox held, after the second Create: %q, %v; want %q (adopted, not made anew)", got, err, marker)
			}
		} else {
			ss, err := s.reg.ListSessions(ctx, second)
			if err != nil {
				t.Fatalf("ListSessions: %v", err)
			}
			found := false
			for _, se := range ss {
				found = found || se.ID == session
			}
			if !found {
				t.Fatalf("the first sandbox's session %s is gone after the second Create (%+v): made anew, not adopted", session, ss)
			}
		}
		names, err := s.reg.ListAllNames(ctx, s.p.Name())
		if err != nil {
			t.Fatalf("ListAllNames: %v", err)
		}
		n := 0
		for _, x := range names {
			if x == name {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("ListAllNames holds %q %d times after two Creates, want once", name, n)
		}
	})
	t.Run("GetMissingIsNotFound", func(t *testing.T) { // test 6
		h := sandbox.BuildHandle(s.p.Name(), s.cfg.names())
		if _, err := s.reg.Get(s.ctx(t), h); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Get(never created) = %v, want ErrNotFound", err)
		}
	})
	t.Run("DestroyIsTolerantAndDefinitive", func(t *testing.T) { // test 7
		ctx := s.ctx(t)
		if err := s.reg.Destroy(ctx, sandbox.BuildHandle(s.p.Name(), s.cfg.names())); err != nil {
			t.Fatalf("Destroy(never created) = %v, want nil", err)
		}
		h := s.created(t)
		if err := s.reg.Destroy(ctx, h); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		if _, err := s.reg.Get(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Get after Destroy = %v, want ErrNotFound", err)
		}
		if err := s.reg.Destroy(ctx, h); err != nil {
			t.Fatalf("second Destroy = %v, want nil", err)
		}
	})
	t.Run("DestroyOnce", func(t *testing.T) {
		s.require(t, sandbox.CapDestroyOnce)
		ctx := s.ctx(t)
		h := s.created(t)
		if err := s.reg.DestroyOnce(ctx, h, sandbox.DestroyOnceOptions{}); err != nil {
			t.Fatalf("DestroyOnce: %v", err)
		}
		if _, err := s.reg.Get(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Get after DestroyOnce = %v, want ErrNotFound", err)
		}
		if err := s.reg.DestroyOnce(ctx, h, sandbox.DestroyOnceOptions{}); err != nil {
			t.Fatalf("DestroyOnce of an absent sandbox = %v, want nil", err)
		}
	})
	t.Run("UnimplementedOptionalsAreNotSupported", func(t *testing.T) {
		ctx := s.ctx(t)
		h := sandbox.BuildHandle(s.p.Name(), s.cfg.names())
		if _, ok := s.p.(sandbox.CreateNewer); !ok {
			if _, err := s.reg.CreateNew(ctx, s.p.Name(), h.Name, sandbox.CreateNewOptions{}); !errors.Is(err, sandbox.ErrNotSupported) {
				t.Errorf("CreateNew = %v, want ErrNotSupported", err)
			}
		}
		if _, ok := s.p.(sandbox.OnceDestroyer); !ok {
			if err := s.reg.DestroyOnce(ctx, h, sandbox.DestroyOnceOptions{}); !errors.Is(err, sandbox.ErrNotSupported) {
				t.Errorf("DestroyOnce = %v, want ErrNotSupported", err)
			}
		}
		if !s.has(sandbox.CapTerminateSession) {
			if err := s.reg.TerminateSession(ctx, h, "s1", sandbox.TerminateOptions{}); !errors.Is(err, sandbox.ErrNotSupported) {
				t.Errorf("TerminateSession = %v, want ErrNotSupported", err)
			}
		}
		if _, ok := s.p.(sandbox.CheckpointOnceCreator); !ok {
			if _, err := s.reg.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op-1"}); !errors.Is(err, sandbox.ErrNotSupported) {
				t.Errorf("CreateCheckpointOnce = %v, want ErrNotSupported", err)
			}
		}
		if s.has(sandbox.CapCreateCheckpointOnce) {
			return
		}
		// Unadvertised, it is refused whatever the adapter implements,
		// on a sandbox that exists too.
		if _, err := s.reg.CreateCheckpointOnce(ctx, s.created(t), sandbox.CheckpointOnceOptions{OperationID: "op-" + h.Name}); !errors.Is(err, sandbox.ErrNotSupported) {
			t.Errorf("CreateCheckpointOnce without create_checkpoint_once advertised = %v, want ErrNotSupported", err)
		}
	})
	t.Run("ListAllNamesHasCreated", func(t *testing.T) { // test 8
		h := s.created(t)
		names, err := s.reg.ListAllNames(s.ctx(t), s.p.Name())
		if err != nil {
			t.Fatalf("ListAllNames: %v", err)
		}
		found := false
		for _, n := range names {
			found = found || n == h.Name
		}
		if !found {
			t.Fatalf("ListAllNames lacks %q", h.Name)
		}
	})
	t.Run("SuspendResumeAreTotal", func(t *testing.T) { // test 9
		ctx := s.ctx(t)
		h := s.created(t)
		if err := s.reg.Suspend(ctx, h); err != nil {
			t.Fatalf("Suspend: %v", err)
		}
		if s.has(sandbox.CapSuspend) && !s.cfg.selfParking {
			if info, err := s.reg.Get(ctx, h); err != nil || info.Status != sandbox.StatusSuspended {
				t.Fatalf("Get after Suspend = %v, %v; want status suspended", info.Status, err)
			}
		}
		r, err := s.reg.Resume(ctx, h)
		if err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if info, err := s.reg.Get(ctx, r); err != nil {
			t.Fatalf("Get after Resume: %v", err)
		} else if info.Status != sandbox.StatusRunning {
			t.Fatalf("Get after Resume: status %v, want running", info.Status)
		}
		res, err := s.reg.Exec(ctx, r, s.fx.ExecOK, sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Exec after Resume = %v, %v", res, err)
		}
	})
	t.Run("MissingSandboxIsNotFound", func(t *testing.T) {
		ctx := s.ctx(t)
		h := sandbox.BuildHandle(s.p.Name(), s.cfg.names())
		if _, err := s.reg.Exec(ctx, h, s.fx.ExecOK, sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("Exec on a missing sandbox = %v, want ErrNotFound", err)
		}
		if s.has(sandbox.CapAttach) {
			if c, err := s.reg.Attach(ctx, h, "no-such-session", sandbox.AttachOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("Attach on a missing sandbox = %v, want ErrNotFound", err)
				if c != nil {
					_ = c.Stop()
				}
			}
		}
	})
}

func (s *suite) exec(t *testing.T) {
	t.Run("CollectsOutputZeroExit", func(t *testing.T) { // test 10
		h := s.created(t)
		res, err := s.reg.Exec(s.ctx(t), h, s.fx.ExecOK, sandbox.ExecOptions{})
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		if res.ExitCode != 0 || !bytes.Contains(res.Output, []byte(s.fx.ExecOKWant)) {
			t.Fatalf("Exec = %q exit %d, want output containing %q and exit 0", res.Output, res.ExitCode, s.fx.ExecOKWant)
		}
	})
	t.Run("NonzeroExitIsData", func(t *testing.T) { // test 11
		h := s.created(t)
		res, err := s.reg.Exec(s.ctx(t), h, s.fx.ExecFail, sandbox.ExecOptions{})
		if err != nil {
			t.Fatalf("Exec: %v (a nonzero exit is a result, not an error)", err)
		}
		if res.ExitCode != s.fx.ExecFailCode {
			t.Fatalf("exit %d, want %d", res.ExitCode, s.fx.ExecFailCode)
		}
	})
	t.Run("StderrDroppedUnlessMerged", func(t *testing.T) {
		h := s.created(t)
		ctx := s.ctx(t)
		res, err := s.reg.Exec(ctx, h, s.fx.Stderr, sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Exec = %v, %v", res, err)
		}
		if bytes.Contains(res.Output, []byte(s.fx.StderrWant)) {
			t.Fatalf("stderr %q in output without StderrToStdout: %q", s.fx.StderrWant, res.Output)
		}
		res, err = s.reg.Exec(ctx, h, s.fx.Stderr, sandbox.ExecOptions{StderrToStdout: true})
		if err != nil || !bytes.Contains(res.Output, []byte(s.fx.StderrWant)) {
			t.Fatalf("merged Exec = %q, %v; want it to contain %q", res.Output, err, s.fx.StderrWant)
		}
	})
	t.Run("EnvAndDir", func(t *testing.T) {
		h := s.created(t)
		token := fmt.Sprintf("tok-%d", time.Now().UnixNano())
		res, err := s.reg.Exec(s.ctx(t), h, s.fx.EnvDir, sandbox.ExecOptions{
			Env: []string{"MANAGOAT_CONFORMANCE=" + token}, Dir: s.cfg.dir})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Exec = %v, %v", res, err)
		}
		if !bytes.Contains(res.Output, []byte(token)) || !bytes.Contains(res.Output, []byte(s.cfg.dir)) {
			t.Fatalf("output %q lacks the env value %q or the dir %q", res.Output, token, s.cfg.dir)
		}
	})
	t.Run("TimeoutIsUnavailable", func(t *testing.T) {
		h := s.created(t)
		start := time.Now()
		const budget = 500 * time.Millisecond
		_, err := s.reg.Exec(s.ctx(t), h, s.fx.Slow, sandbox.ExecOptions{Timeout: budget})
		if !sandbox.IsExecTimeout(err) {
			t.Fatalf("Exec past its budget = %v, want Unavailable{exec_timeout}", err)
		}
		var u *sandbox.UnavailableError
		if errors.As(err, &u) && u.Timeout != budget {
			t.Errorf("exec_timeout carries %v, want the original budget %v", u.Timeout, budget)
		}
		if el := time.Since(start); el > budget+s.cfg.timeout {
			t.Errorf("Exec returned after %v; output must not renew the %v budget", el, budget)
		}
		if !sandbox.Transient(err) {
			t.Errorf("exec_timeout is not transient")
		}
	})
	t.Run("SpentBudgetNeverDispatches", func(t *testing.T) {
		h := s.created(t)
		_, err := s.reg.Exec(s.ctx(t), h, s.fx.ExecOK, sandbox.ExecOptions{Timeout: -1})
		if !sandbox.IsExecTimeout(err) {
			t.Fatalf("Exec with a spent budget = %v, want Unavailable{exec_timeout}", err)
		}
		_, err = s.p.Exec(s.ctx(t), h, s.fx.ExecOK, sandbox.ExecOptions{Timeout: -1})
		if !sandbox.IsExecTimeout(err) {
			t.Fatalf("provider Exec with a spent budget = %v, want Unavailable{exec_timeout}", err)
		}
	})
	t.Run("DropIsClosedBeforeExit", func(t *testing.T) {
		if s.fx.SpawnDrop.Name == "" {
			t.Skip("no SpawnDrop fixture: the provider cannot stage a transport that closes without an exit")
		}
		h := s.created(t)
		_, err := s.reg.Exec(s.ctx(t), h, s.fx.SpawnDrop, sandbox.ExecOptions{})
		if !sandbox.IsClosedBeforeExit(err) {
			t.Fatalf("Exec of a dropped stream = %v, want Unavailable{closed_before_exit}", err)
		}
	})
}

func (s *suite) streaming(t *testing.T) {
	t.Run("OutputThenOneExit", func(t *testing.T) { // test 12
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnOK, false)
		tr := s.finish(t, c)
		s.wantExit(t, tr, 0)
		if tr.stdout.Len() == 0 {
			t.Fatalf("no stdout before the exit")
		}
	})
	t.Run("DropIsAnErrorNeverExit", func(t *testing.T) { // test 13
		if s.fx.SpawnDrop.Name == "" {
			t.Skip("no SpawnDrop fixture: the provider cannot stage a transport that closes without an exit")
		}
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnDrop, false)
		tr := s.finish(t, c)
		if tr.stdout.Len() == 0 {
			t.Errorf("no stdout before the drop")
		}
		if tr.terminal.Kind != sandbox.Error {
			t.Fatalf("terminal %v (code %d), want an error event", tr.terminal.Kind, tr.terminal.Code)
		}
	})
	t.Run("StderrEvents", func(t *testing.T) {
		h := s.created(t)
		c := s.spawn(t, h, s.fx.Stderr, false)
		tr := s.finish(t, c)
		s.wantExit(t, tr, 0)
		if !strings.Contains(tr.stderr.String(), s.fx.StderrWant) {
			t.Fatalf("stderr events %q lack %q (stdout %q)", tr.stderr.String(), s.fx.StderrWant, tr.stdout.String())
		}
	})
	t.Run("WriteStdinAfterExitIsCommandExited", func(t *testing.T) { // test 14
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnOK, true)
		s.wantExit(t, s.finish(t, c), 0)
		if err := s.reg.WriteStdin(s.ctx(t), c, []byte("late\n")); !errors.Is(err, sandbox.ErrCommandExited) {
			t.Fatalf("WriteStdin after exit = %v, want ErrCommandExited", err)
		}
	})
	t.Run("StdinRoundTrip", func(t *testing.T) { // test 15
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		if err := s.reg.WriteStdin(ctx, c, []byte("ping")); err != nil {
			t.Fatalf("WriteStdin: %v", err)
		}
		s.waitStdoutContaining(t, c, "ping")
		if err := s.reg.CloseStdin(ctx, c); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
		s.wantExit(t, s.finish(t, c), 0)
	})
	t.Run("StopIsTotal", func(t *testing.T) { // test 16
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		if err := s.reg.StopCommand(c); err != nil {
			t.Fatalf("StopCommand: %v", err)
		}
		if err := s.reg.StopCommand(c); err != nil {
			t.Fatalf("second StopCommand: %v", err)
		}
	})
	t.Run("StdinAfterStopIsCommandExited", func(t *testing.T) {
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		_ = c.Stop()
		if err := s.reg.WriteStdin(ctx, c, []byte("x")); !errors.Is(err, sandbox.ErrCommandExited) {
			t.Errorf("WriteStdin after Stop = %v, want ErrCommandExited", err)
		}
		if err := s.reg.CloseStdin(ctx, c); !errors.Is(err, sandbox.ErrCommandExited) {
			t.Errorf("CloseStdin after Stop = %v, want ErrCommandExited", err)
		}
		s.terminateIfPossible(t, h)
	})
}

// terminateIfPossible stops the sandbox's sessions where the provider can,
// so a case that left a command running does not leak it.
func (s *suite) terminateIfPossible(t *testing.T, h *sandbox.Handle) {
	t.Helper()
	if !s.has(sandbox.CapTerminateSession) {
		return
	}
	ss, err := s.reg.ListSessions(s.ctx(t), h)
	if err != nil {
		return
	}
	for _, se := range ss {
		_ = s.reg.TerminateSession(s.ctx(t), h, se.ID, sandbox.TerminateOptions{})
	}
}
