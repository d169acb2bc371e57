package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// cmdServer drives one envd Start stream (an exec, a spawn or an attach's
// replayer) into a sandbox.Stream: output events, then exactly one terminal
// event. It renews the sandbox's TTL while it runs and declares the stream
// stalled when envd stays silent (not even a keepalive) for StallTimeout.
type cmdServer struct {
	p         *Provider
	sandboxID string
	tag       string // the session's tag: stdin target and journal name
	attach    bool   // a replayer: stdin goes to tag, the exit code comes from the exit file
	journaled bool   // a session with journals: its tag is the Command's SessionID
	stream    *sandbox.Stream

	body   io.ReadCloser
	cancel context.CancelFunc // ends the HTTP request

	mu      sync.Mutex
	pid     uint32 // stdin target once known; 0 means "by tag"
	termErr error  // the terminal error, for a spawn whose stream died before start
	exited  bool
	// capAt is when the sandbox will end whatever the heartbeat does: E2B
	// capped its TTL at the plan's maximum instance length (or refused the
	// heartbeat, 400 "Max instance length exceeded"). Zero when not capped.
	capAt time.Time

	started  chan struct{}
	finished chan struct{}
	startOne sync.Once
	stopped  atomic.Bool
	stalled  atomic.Bool
}

func (s *cmdServer) exitPath() string { return JournalDir + "/" + s.tag + ".exit" }

func (s *cmdServer) run() {
	defer close(s.finished)
	defer s.body.Close()
	defer s.cancel()
	hbCtx, hbStop := context.WithCancel(context.Background())
	var hb sync.WaitGroup
	hb.Add(1)
	go func() { defer hb.Done(); s.heartbeats(hbCtx) }()
	defer hb.Wait()
	defer hbStop()

	stall := s.p.cfg.StallTimeout
	watchdog := time.AfterFunc(stall, func() { s.stalled.Store(true); s.cancel() })
	defer watchdog.Stop()
	er := NewEnvelopeReader(s.body)
	for {
		flag, payload, err := er.Next()
		if err != nil {
			switch {
			case s.stopped.Load():
			case s.stalled.Load():
				if err := s.capped(); err != nil {
					s.fail(err)
					break
				}
				s.fail(sandbox.Unavailable("stream_stalled", errors.New("envd sent nothing, not even a keepalive, for "+stall.String())))
			default:
				if err == io.EOF {
					err = errNoEnd
				}
				s.closedBeforeExit(err)
			}
			return
		}
		watchdog.Reset(stall)
		if flag&FlagEndStream != 0 {
			var es endStream
			if json.Unmarshal(payload, &es) == nil && es.Error != nil {
				s.fail(connectError(es.Error.Code, es.Error.Message))
			} else {
				s.closedBeforeExit(errNoEnd)
			}
			return
		}
		if flag&FlagCompressed != 0 {
			s.fail(&sandbox.ProviderError{Provider: Name, Reason: "compressed_envelope"})
			return
		}
		var msg startResponse
		if json.Unmarshal(payload, &msg) != nil || msg.Event == nil {
			continue
		}
		ev := msg.Event
		switch {
		case ev.Start != nil:
			if !s.attach {
				s.mu.Lock()
				s.pid = ev.Start.Pid
				s.mu.Unlock()
			}
			s.startOne.Do(func() { close(s.started) })
		case ev.Data != nil:
			s.stream.Stdout(decodeB64(ev.Data.Stdout))
			s.stream.Stdout(decodeB64(ev.Data.Pty))
			s.stream.Stderr(decodeB64(ev.Data.Stderr))
		case ev.End != nil:
			code := 0
			if ev.End.ExitCode != nil {
				code = *ev.End.ExitCode
			} else if ev.End.ExitCode2 != nil {
				code = *ev.End.ExitCode2
			}
			if sig, ok := signalCode(ev.End.Status); ok && (!ev.End.Exited || code < 0) {
				code = sig
			}
			s.end(code)
			return
		}
	}
}

// heartbeats renews the TTL at once and then every Heartbeat, so a live
// command never lets its sandbox auto-pause (and a command started late in
// a TTL does not wait a whole interval for its first renewal).
func (s *cmdServer) heartbeats(ctx context.Context) {
	t := time.NewTicker(s.p.cfg.Heartbeat)
	defer t.Stop()
	for {
		sent := time.Now()
		err := s.p.heartbeat(ctx, s.sandboxID)
		switch {
		case err != nil && ctx.Err() == nil:
			s.p.cfg.Logger.Warn("e2b: heartbeat failed", "sandbox", s.sandboxID, "err", err)
			if isMaxInstanceLength(err) {
				s.setCap(sent)
			}
		case err == nil:
			// E2B shortens a TTL that would pass the maximum instance
			// length without saying so; the sandbox's endAt tells.
			if end, err := s.p.sandboxEnd(ctx, s.sandboxID); err == nil && end.Before(sent.Add(s.p.cfg.SandboxTimeout-capSlack(s.p.cfg.SandboxTimeout))) {
				s.setCap(end)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *cmdServer) fail(err error) {
	s.mu.Lock()
	if s.termErr == nil {
		s.termErr = err
	}
	s.mu.Unlock()
	s.stream.Fail(err)
}

func (s *cmdServer) exit(code int) {
	s.mu.Lock()
	s.exited = true
	s.mu.Unlock()
	s.stream.Exit(code)
}

// signalCode renders envd's status of a process killed by a signal
// ("signal: killed", Go's wording) as a shell would: 128 + the signal.
func signalCode(status string) (int, bool) {
	name, ok := strings.CutPrefix(status, "signal: ")
	if !ok {
		return 0, false
	}
	for i := 1; i < 32; i++ {
		if syscall.Signal(i).String() == name {
			return 128 + i, true
		}
	}
	return 0, false
}

// end handles envd's end event. A replayer's own code is a proxy: the
// session's real code is in its exit file, and without it no code is
// reported at all (never a fabricated one).
func (s *cmdServer) end(code int) {
	if !s.attach {
		s.exit(code)
		return
	}
	if c, ok := s.readExit(); ok {
		s.exit(c)
		return
	}
	if code == 44 {
		s.fail(sandbox.ErrNotFound)
		return
	}
	s.fail(sandbox.ClosedBeforeExit())
}

// closedBeforeExit handles a stream that ended without an end event: an
// attach may still read the session's real code from its exit file;
// otherwise it is Unavailable{closed_before_exit}, never exit 0. (A
// spawner does not: its own stream's verdict is the drop.)
func (s *cmdServer) closedBeforeExit(cause error) {
	if s.attach {
		if c, ok := s.readExit(); ok {
			s.exit(c)
			return
		}
	}
	if err := s.capped(); err != nil {
		s.fail(err)
		return
	}
	s.fail(&sandbox.UnavailableError{Reason: sandbox.ReasonClosedBeforeExit, Err: cause})
}

func (s *cmdServer) readExit() (int, bool) {
	if s.stopped.Load() {
		return 0, false
	}
	b, err := s.p.readFile(context.Background(), s.sandboxID, s.exitPath(), 64)
	if err != nil {
		return 0, false
	}
	c, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return c, err == nil
}

// stop ends the local end: the request is cancelled and the reader
// goroutine is waited for (briefly). The remote process keeps running.
func (s *cmdServer) stop() {
	s.stopped.Store(true)
	s.cancel()
	select {
	case <-s.finished:
	case <-time.After(2 * time.Second):
	}
}

// awaitStart blocks until envd acknowledged the process (its start event)
// or the stream ended first, bounded by RequestTimeout.
func (s *cmdServer) awaitStart(ctx context.Context) error {
	t := time.NewTimer(s.p.cfg.RequestTimeout)
	defer t.Stop()
	select {
	case <-s.started:
		return nil
	case <-s.finished:
		select {
		case <-s.started:
			return nil
		default:
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.exited {
			return nil
		}
		if s.termErr != nil {
			return s.termErr
		}
		return sandbox.ClosedBeforeExit()
	case <-t.C:
		return sandbox.Unavailable("start_timeout", errors.New("envd sent no start event within "+s.p.cfg.RequestTimeout.String()))
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return sandbox.Unavailable(sandbox.ReasonTimeout, ctx.Err())
		}
		return ctx.Err()
	}
}

// selector is the stdin target: the pid when known, else the tag.
func (s *cmdServer) selector() selector {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pid != 0 {
		return selector{Pid: s.pid}
	}
	return selector{Tag: s.tag}
}

func (s *cmdServer) setPid(pid uint32) {
	s.mu.Lock()
	s.pid = pid
	s.mu.Unlock()
}

// ReasonMaxInstanceLength is the UnavailableError reason of a command whose
// sandbox reached its plan's maximum instance length: E2B refuses to
// extend the TTL past it and pauses (or kills) the sandbox at it. A resume
// starts a new instance, so a later command can run again.
const ReasonMaxInstanceLength = "max_instance_length"

func isMaxInstanceLength(err error) bool {
	var inv *sandbox.InvalidError
	return errors.As(err, &inv) && inv.HTTP != nil && inv.HTTP.Status == 400 &&
		strings.Contains(strings.ToLower(inv.HTTP.Body), "max instance length")
}

// capSlack is how much shorter than asked a TTL may come back before it
// counts as capped (clock skew and the request's own time).
func capSlack(ttl time.Duration) time.Duration {
	return 2*time.Second + ttl/20
}

func (s *cmdServer) setCap(at time.Time) {
	s.mu.Lock()
	if s.capAt.IsZero() || at.Before(s.capAt) {
		s.capAt = at
	}
	s.mu.Unlock()
}

// capped is the error of a stream that died because the sandbox reached
// its maximum instance length, or nil when that is not why.
func (s *cmdServer) capped() error {
	s.mu.Lock()
	at := s.capAt
	s.mu.Unlock()
	if at.IsZero() || time.Now().Before(at.Add(-capSlack(0))) {
		return nil
	}
	return &sandbox.UnavailableError{Reason: ReasonMaxInstanceLength,
		Err: errors.New("the sandbox reached its plan's maximum instance length at " + at.UTC().Format(time.RFC3339) +
			" and E2B would not extend it; the command's stream ended with it (a resume starts a new instance)")}
}
