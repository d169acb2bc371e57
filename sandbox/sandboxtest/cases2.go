package sandboxtest

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// sessionFor finds the session whose command line is c's, or the only one.
func (s *suite) sessionFor(t *testing.T, h *sandbox.Handle, c sandbox.Cmd) sandbox.Session {
	t.Helper()
	ss, err := s.reg.ListSessions(s.ctx(t), h)
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	if len(ss) == 0 {
		t.Fatalf("ListSessions is empty after a spawn")
	}
	for _, se := range ss {
		if se.Command == c.String() {
			return se
		}
	}
	return ss[0]
}

func (s *suite) attach(t *testing.T, h *sandbox.Handle, id string) *sandbox.Command {
	t.Helper()
	c, err := s.reg.Attach(s.ctx(t), h, id, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatalf("Attach(%q): %v", id, err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func (s *suite) sessions(t *testing.T) {
	t.Run("AttachReplaysFromByteZeroThenTails", func(t *testing.T) { // test 17
		s.require(t, sandbox.CapAttach)
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		pre := s.waitStdout(t, c)
		se := s.sessionFor(t, h, s.fx.SpawnStay)
		// Two attachers at once: each gets the whole replay exactly once.
		a1 := s.attach(t, h, se.ID)
		a2 := s.attach(t, h, se.ID)
		for _, a := range []*sandbox.Command{a1, a2} {
			if a.Ref == c.Ref || a.Ref == "" {
				t.Fatalf("attached ref %q must be fresh (spawned %q)", a.Ref, c.Ref)
			}
			got := s.waitStdout(t, a)
			if !bytes.HasPrefix(pre, got) && !bytes.HasPrefix(got, pre) {
				t.Fatalf("first replayed chunk %q does not start at byte zero of %q", got, pre)
			}
			if len(got) < len(pre) {
				s.waitStdoutContainingPrefix(t, a, got, pre)
			}
		}
		if err := s.reg.WriteStdin(ctx, c, []byte("after-attach")); err != nil {
			t.Fatalf("WriteStdin: %v", err)
		}
		s.waitStdoutContaining(t, c, "after-attach")
		for _, a := range []*sandbox.Command{a1, a2} {
			s.waitStdoutContaining(t, a, "after-attach")
		}
		if err := s.reg.CloseStdin(ctx, c); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
		for _, a := range []*sandbox.Command{c, a1, a2} {
			s.wantExit(t, s.finish(t, a), 0)
		}
	})
	t.Run("AttachToFinishedSessionReplaysVerdict", func(t *testing.T) {
		s.require(t, sandbox.CapAttach)
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnOK, false)
		first := s.finish(t, c)
		s.wantExit(t, first, 0)
		se := s.sessionFor(t, h, s.fx.SpawnOK)
		tr := s.finish(t, s.attach(t, h, se.ID))
		s.wantExit(t, tr, 0)
		if !bytes.Equal(tr.stdout.Bytes(), first.stdout.Bytes()) {
			t.Fatalf("replay %q differs from the original output %q", tr.stdout.String(), first.stdout.String())
		}
	})
	t.Run("AttachToDroppedSessionReplaysError", func(t *testing.T) {
		s.require(t, sandbox.CapAttach)
		if s.fx.SpawnDrop.Name == "" {
			t.Skip("no SpawnDrop fixture")
		}
		h := s.created(t)
		c := s.spawn(t, h, s.fx.SpawnDrop, false)
		if tr := s.finish(t, c); tr.terminal.Kind != sandbox.Error {
			t.Fatalf("spawner's terminal %v, want error", tr.terminal.Kind)
		}
		se := s.sessionFor(t, h, s.fx.SpawnDrop)
		tr := s.finish(t, s.attach(t, h, se.ID))
		if tr.terminal.Kind != sandbox.Error {
			t.Fatalf("attach to a dropped session ends with %v (code %d), want its error verdict", tr.terminal.Kind, tr.terminal.Code)
		}
	})
	t.Run("AttachUnknownSessionIsNotFound", func(t *testing.T) {
		s.require(t, sandbox.CapAttach)
		h := s.created(t)
		c, err := s.reg.Attach(s.ctx(t), h, "no-such-session", sandbox.AttachOptions{})
		if c != nil {
			_ = c.Stop()
		}
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Attach(unknown) = %v, want ErrNotFound", err)
		}
	})
}

// waitStdoutContainingPrefix reads stdout from a until what it replayed
// covers pre, checking every byte matches.
func (s *suite) waitStdoutContainingPrefix(t *testing.T, a *sandbox.Command, got, pre []byte) {
	t.Helper()
	buf := append([]byte(nil), got...)
	for len(buf) < len(pre) {
		buf = append(buf, s.waitStdout(t, a)...)
	}
	if !bytes.HasPrefix(buf, pre) {
		t.Fatalf("replay %q does not start with the original first chunk %q", buf, pre)
	}
}

func (s *suite) termination(t *testing.T) {
	t.Run("TerminateStopsDetachedSessionKeepsSandbox", func(t *testing.T) { // test 18
		s.require(t, sandbox.CapTerminateSession)
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		ss, err := s.reg.ListSessions(ctx, h)
		if err != nil || len(ss) != 1 {
			t.Fatalf("ListSessions = %v, %v; want exactly one session", ss, err)
		}
		var watcher *sandbox.Command
		if s.has(sandbox.CapAttach) {
			watcher = s.attach(t, h, ss[0].ID)
		}
		if err := s.reg.StopCommand(c); err != nil {
			t.Fatalf("StopCommand: %v", err)
		}
		opts := sandbox.TerminateOptions{Timeout: min(s.cfg.timeout, 30e9)}
		if err := s.reg.TerminateSession(ctx, h, ss[0].ID, opts); err != nil {
			t.Fatalf("TerminateSession: %v", err)
		}
		if err := s.reg.TerminateSession(ctx, h, ss[0].ID, opts); err != nil {
			t.Fatalf("second TerminateSession: %v", err)
		}
		if watcher != nil {
			tr := s.finish(t, watcher)
			if tr.terminal.Kind == sandbox.Exit && tr.terminal.Code == 0 {
				t.Errorf("a terminated session reports exit 0")
			}
		}
		if _, err := s.reg.Get(ctx, h); err != nil {
			t.Fatalf("Get after TerminateSession: %v", err)
		}
		res, err := s.reg.Exec(ctx, h, s.fx.ExecOK, sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 0 || !bytes.Contains(res.Output, []byte(s.fx.ExecOKWant)) {
			t.Fatalf("Exec after TerminateSession = %q %d, %v", res.Output, res.ExitCode, err)
		}
	})
	t.Run("TerminateLeavesNeighbour", func(t *testing.T) {
		s.require(t, sandbox.CapTerminateSession)
		h := s.created(t)
		ctx := s.ctx(t)
		victim := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, victim)
		ss, _ := s.reg.ListSessions(ctx, h)
		if len(ss) != 1 {
			t.Fatalf("ListSessions = %v, want one", ss)
		}
		neighbour := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, neighbour)
		if err := s.reg.TerminateSession(ctx, h, ss[0].ID, sandbox.TerminateOptions{}); err != nil {
			t.Fatalf("TerminateSession: %v", err)
		}
		if tr := s.finish(t, victim); tr.terminal.Kind == sandbox.Exit && tr.terminal.Code == 0 {
			t.Errorf("the terminated session reports exit 0")
		}
		if err := s.reg.WriteStdin(ctx, neighbour, []byte("still here")); err != nil {
			t.Fatalf("WriteStdin to the neighbour: %v", err)
		}
		s.waitStdoutContaining(t, neighbour, "still here")
		_ = s.reg.CloseStdin(ctx, neighbour)
		s.wantExit(t, s.finish(t, neighbour), 0)
	})
	t.Run("ConcurrentTerminationsOneVerdict", func(t *testing.T) {
		s.require(t, sandbox.CapTerminateSession)
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		se := s.sessionFor(t, h, s.fx.SpawnStay)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { errs[i] = s.reg.TerminateSession(ctx, h, se.ID, sandbox.TerminateOptions{}) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Errorf("concurrent TerminateSession: %v", err)
			}
		}
		s.finish(t, c) // exactly one terminal event, then closed
		if err := s.reg.TerminateSession(ctx, h, se.ID, sandbox.TerminateOptions{}); err != nil {
			t.Errorf("third TerminateSession: %v", err)
		}
	})
	t.Run("TerminateKeepsCompletedResult", func(t *testing.T) {
		s.require(t, sandbox.CapTerminateSession)
		s.require(t, sandbox.CapAttach)
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		se := s.sessionFor(t, h, s.fx.SpawnStay)
		if err := s.reg.CloseStdin(ctx, c); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
		s.wantExit(t, s.finish(t, c), 0)
		if err := s.reg.TerminateSession(ctx, h, se.ID, sandbox.TerminateOptions{}); err != nil {
			t.Fatalf("TerminateSession of a finished session: %v", err)
		}
		s.wantExit(t, s.finish(t, s.attach(t, h, se.ID)), 0)
	})
	t.Run("TerminateAbsentGracefulIsNil", func(t *testing.T) {
		s.require(t, sandbox.CapTerminateSession)
		h := s.created(t)
		if err := s.reg.TerminateSession(s.ctx(t), h, "absent", sandbox.TerminateOptions{}); err != nil {
			t.Fatalf("graceful TerminateSession of an absent session = %v, want nil", err)
		}
	})
	t.Run("TerminateRequestValidation", func(t *testing.T) {
		h := s.created(t)
		ctx := s.ctx(t)
		for _, tc := range []struct {
			id   string
			opts sandbox.TerminateOptions
		}{
			{"", sandbox.TerminateOptions{}},
			{"../other", sandbox.TerminateOptions{}},
			{"a/b", sandbox.TerminateOptions{}},
			{"a?x=1", sandbox.TerminateOptions{}},
			{string(bytes.Repeat([]byte("a"), 257)), sandbox.TerminateOptions{}},
			{"ok", sandbox.TerminateOptions{Mode: "unknown"}},
			{"ok", sandbox.TerminateOptions{Timeout: 30e9 + 1}},
			{"ok", sandbox.TerminateOptions{Timeout: -1}},
		} {
			err := s.reg.TerminateSession(ctx, h, tc.id, tc.opts)
			var iv *sandbox.InvalidError
			if !errors.As(err, &iv) || iv.Reason != sandbox.ReasonTerminationRequest {
				t.Errorf("TerminateSession(%.20q, %+v) = %v, want Invalid{termination_request}", tc.id, tc.opts, err)
			}
		}
	})
	t.Run("ForceTerminate", func(t *testing.T) {
		s.require(t, sandbox.CapForceTerminateSession)
		h := s.created(t)
		ctx := s.ctx(t)
		c := s.spawn(t, h, s.fx.SpawnStay, true)
		s.waitStdout(t, c)
		se := s.sessionFor(t, h, s.fx.SpawnStay)
		if err := s.reg.TerminateSession(ctx, h, se.ID, sandbox.TerminateOptions{Mode: sandbox.Force}); err != nil {
			t.Fatalf("force TerminateSession: %v", err)
		}
		if tr := s.finish(t, c); tr.terminal.Kind == sandbox.Exit && tr.terminal.Code == 0 {
			t.Errorf("a force-terminated session reports exit 0")
		}
		err := s.reg.TerminateSession(ctx, h, "absent", sandbox.TerminateOptions{Mode: sandbox.Force})
		if err == nil {
			t.Errorf("force TerminateSession of an absent session = nil; absence is not evidence in force mode")
		}
	})
	t.Run("ForceWithoutCapabilityIsNotSupported", func(t *testing.T) {
		if s.has(sandbox.CapForceTerminateSession) {
			t.Skip("force_terminate_session is advertised")
		}
		h := sandbox.BuildHandle(s.p.Name(), s.cfg.names())
		err := s.reg.TerminateSession(s.ctx(t), h, "s1", sandbox.TerminateOptions{Mode: sandbox.Force})
		if !errors.Is(err, sandbox.ErrNotSupported) {
			t.Fatalf("force TerminateSession = %v, want ErrNotSupported", err)
		}
	})
}

func (s *suite) governance(t *testing.T) {
	t.Run("EmptyAllowlistAccepted", func(t *testing.T) { // test 19
		s.require(t, sandbox.CapNetworkPolicy)
		h := s.created(t)
		ctx := s.ctx(t)
		if s.fx.Connect == nil {
			if err := s.reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
				t.Fatalf("ApplyNetworkPolicy(deny all): %v", err)
			}
			if err := s.reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}}); err != nil {
				t.Fatalf("ApplyNetworkPolicy(allow list): %v", err)
			}
			t.Skip("Fixtures.Connect is unset: the policies were accepted, deny-all was not observed (a skip is not a pass)")
		}
		// A listener of this host, on an address a sandbox with egress can
		// reach: under deny-all no connection may arrive.
		ln, err := net.Listen("tcp4", hostAddr()+":0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		defer ln.Close()
		var accepted atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		addr := ln.Addr().String()
		connect := func(what string) bool {
			t.Helper()
			res, err := s.reg.Exec(ctx, h, s.fx.Connect(addr), sandbox.ExecOptions{StderrToStdout: true, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatalf("%s: Exec(connect %s): %v", what, addr, err)
			}
			return res.ExitCode == 0
		}
		if connect("before any policy") {
			t.Logf("control: the sandbox reached %s before a policy", addr)
			// its accept may still be on the way: count it before the
			// policies, not as a breach under them
			for end := time.Now().Add(10 * time.Second); accepted.Load() == 0 && time.Now().Before(end); {
				time.Sleep(5 * time.Millisecond)
			}
		} else {
			t.Logf("control: the sandbox could not reach %s before a policy (no egress by default); deny-all is still checked", addr)
		}
		before := accepted.Load()
		if err := s.reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
			t.Fatalf("ApplyNetworkPolicy(deny all): %v", err)
		}
		if connect("deny all") {
			t.Errorf("BREACHED: under an empty allow list the sandbox connected to %s", addr)
		}
		if err := s.reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}}); err != nil {
			t.Fatalf("ApplyNetworkPolicy(allow list): %v", err)
		}
		if connect("an allow list without this host") {
			t.Errorf("BREACHED: an allow list of api.example.com let the sandbox connect to %s", addr)
		}
		// An Exec that returned has made its connection, if any.
		if n := accepted.Load() - before; n != 0 {
			t.Errorf("BREACHED: %d connections reached %s under the policies", n, addr)
		}
	})
	t.Run("UnadvertisedCheckpointRefuses", func(t *testing.T) { // test 20
		if s.has(sandbox.CapCheckpoint) {
			t.Skip("checkpoint is advertised")
		}
		h := s.created(t)
		ctx := s.ctx(t)
		if _, err := s.reg.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{}); !errors.Is(err, sandbox.ErrNotSupported) {
			t.Errorf("CreateCheckpoint = %v, want ErrNotSupported", err)
		}
		if err := s.reg.RestoreCheckpoint(ctx, h, "cp-1"); !errors.Is(err, sandbox.ErrNotSupported) {
			t.Errorf("RestoreCheckpoint = %v, want ErrNotSupported", err)
		}
	})
	t.Run("CheckpointRoundTrip", func(t *testing.T) {
		s.require(t, sandbox.CapCheckpoint)
		h := s.created(t)
		ctx := s.ctx(t)
		id, err := s.reg.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{Comment: "conformance"})
		if err != nil || id == "" {
			t.Fatalf("CreateCheckpoint = %q, %v", id, err)
		}
		if err := s.reg.RestoreCheckpoint(ctx, h, id); err != nil {
			t.Fatalf("RestoreCheckpoint(%q): %v", id, err)
		}
		if err := s.reg.RestoreCheckpoint(ctx, h, "no-such-checkpoint"); err == nil {
			t.Fatalf("RestoreCheckpoint of an unknown id succeeded")
		}
	})
	t.Run("CreateCheckpointOnce", func(t *testing.T) {
		s.require(t, sandbox.CapCreateCheckpointOnce)
		h := s.created(t)
		ctx := s.ctx(t)
		id, err := s.reg.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op-" + s.cfg.names()})
		if err != nil || id == "" {
			t.Fatalf("CreateCheckpointOnce = %q, %v", id, err)
		}
		if _, err := s.reg.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "has space"}); !isInvalid(err) {
			t.Fatalf("CreateCheckpointOnce with a bad operation id = %v, want InvalidError", err)
		}
	})
	t.Run("WriteFile", func(t *testing.T) {
		h := s.created(t)
		ctx := s.ctx(t)
		path := s.cfg.writeDir + "/managoat-conformance.txt"
		data := []byte("conformance\x00\xffbytes\n")
		if err := s.reg.WriteFile(ctx, h, path, data, sandbox.WriteFileOptions{Mode: 0o600}); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		if _, ok := s.p.(sandbox.FileReader); ok {
			got, err := s.reg.ReadFile(ctx, h, path)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("ReadFile = %q, %v; want %q", got, err, data)
			}
		}
		missing := sandbox.BuildHandle(s.p.Name(), s.cfg.names())
		if err := s.reg.WriteFile(ctx, missing, path, data, sandbox.WriteFileOptions{}); err == nil {
			t.Fatalf("WriteFile into a missing sandbox succeeded")
		}
	})
}

// hostAddr is a non-loopback IPv4 address of this host (a sandbox in its
// own network namespace cannot reach the host's loopback whatever its
// policy), else 127.0.0.1.
func hostAddr() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	return "127.0.0.1"
}
