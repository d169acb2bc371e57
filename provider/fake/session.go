package fake

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// session is one command process and its journal.
type session struct {
	id      string
	command string
	created time.Time

	mu     sync.Mutex
	buffer []sandbox.Event // output events, oldest first
	exited bool
	code   int
	err    error
	subs   []*sandbox.Stream

	inMu    sync.Mutex
	inQueue []stdinMsg
	inWake  chan struct{}

	stop chan struct{} // closed by kill
	once sync.Once
	done chan struct{} // closed when the goroutine returns
}

type stdinMsg struct {
	data []byte
	eof  bool
}

// private is a Command's adapter state.
type private struct {
	sandbox string
	session *session
}

func (s *session) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *session) kill() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// emit appends to the journal and sends to every current subscriber,
// atomically with respect to attach.
func (s *session) emit(ev sandbox.Event) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited || s.err != nil {
		return false
	}
	switch ev.Kind {
	case sandbox.Stdout, sandbox.Stderr:
		s.buffer = append(s.buffer, ev)
		for _, sub := range s.subs {
			if ev.Kind == sandbox.Stdout {
				sub.Stdout(ev.Data)
			} else {
				sub.Stderr(ev.Data)
			}
		}
	case sandbox.Exit:
		s.exited, s.code = true, ev.Code
		for _, sub := range s.subs {
			sub.Exit(ev.Code)
		}
	case sandbox.Error:
		s.err = ev.Err
		for _, sub := range s.subs {
			sub.Fail(ev.Err)
		}
	}
	return true
}

func (s *session) connected(st *sandbox.Stream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.subs, st)
}

func (s *session) unsubscribe(st *sandbox.Stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs = slices.DeleteFunc(s.subs, func(x *sandbox.Stream) bool { return x == st })
}

func (s *session) pushStdin(m stdinMsg) {
	s.inMu.Lock()
	s.inQueue = append(s.inQueue, m)
	s.inMu.Unlock()
	select {
	case s.inWake <- struct{}{}:
	default:
	}
}

// nextStdin blocks for the next stdin message, or reports false when killed.
func (s *session) nextStdin() (stdinMsg, bool) {
	for {
		s.inMu.Lock()
		if len(s.inQueue) > 0 {
			m := s.inQueue[0]
			s.inQueue = s.inQueue[1:]
			s.inMu.Unlock()
			return m, true
		}
		s.inMu.Unlock()
		select {
		case <-s.inWake:
		case <-s.stop:
			return stdinMsg{}, false
		}
	}
}

func (s *session) run(script []instruction, env []string, dir string, connect func(addr string) string) {
	defer close(s.done)
	out := func(k sandbox.EventKind, d string) {
		s.emit(sandbox.Event{Kind: k, Data: []byte(d)})
	}
	for _, in := range script {
		select {
		case <-s.stop:
			return
		default:
		}
		switch in.op {
		case "out":
			out(sandbox.Stdout, in.arg)
		case "err":
			out(sandbox.Stderr, in.arg)
		case "env":
			out(sandbox.Stdout, lookupEnv(env, in.arg))
		case "pwd":
			out(sandbox.Stdout, dir)
		case "exit":
			s.emit(sandbox.Event{Kind: sandbox.Exit, Code: in.n})
			return
		case "connect":
			if why := connect(in.arg); why != "" {
				out(sandbox.Stderr, why)
				s.emit(sandbox.Event{Kind: sandbox.Exit, Code: 1})
				return
			}
			out(sandbox.Stdout, "connected")
		case "drop":
			s.emit(sandbox.Event{Kind: sandbox.Error, Err: sandbox.ClosedBeforeExit()})
			return
		case "sleep":
			t := time.NewTimer(in.d)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
		case "stay":
			for {
				m, ok := s.nextStdin()
				if !ok {
					return
				}
				if m.eof {
					s.emit(sandbox.Event{Kind: sandbox.Exit, Code: 0})
					return
				}
				out(sandbox.Stdout, "echo:"+string(m.data))
			}
		}
	}
	s.emit(sandbox.Event{Kind: sandbox.Exit, Code: 0})
}

// Spawn starts the script as a goroutine. Every spawn is detachable and
// attachable; the subscriber is registered before the first instruction.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	script, err := parse(c.Args)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	b, err := p.lookup(h)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	p.nextSess++
	s := &session{
		id: "fake-sess-" + strconv.Itoa(p.nextSess), command: c.String(), created: time.Now(),
		inWake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	b.sessions[s.id] = s
	p.mu.Unlock()

	cmd, st := sandbox.NewCommand(p, "", private{sandbox: h.Name, session: s})
	cmd.SessionID = s.id
	s.subs = []*sandbox.Stream{st}
	name := h.Name
	go s.run(script, slices.Clone(opts.Env), opts.Dir, func(addr string) string { return p.connect(context.Background(), name, addr) })
	return cmd, nil
}

func sessionOf(c *sandbox.Command) (*session, bool) {
	pr, ok := c.Private.(private)
	return pr.session, ok && pr.session != nil
}

// WriteStdin delivers data when the process is alive and this handle is
// still connected; otherwise ErrCommandExited.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return err
	}
	s, ok := sessionOf(c)
	if !ok || !s.alive() || !s.connected(c.Stream()) {
		return sandbox.ErrCommandExited
	}
	s.pushStdin(stdinMsg{data: slices.Clone(data)})
	return nil
}

// CloseStdin delivers EOF when this handle is still connected.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return err
	}
	s, ok := sessionOf(c)
	if !ok || !s.connected(c.Stream()) {
		return sandbox.ErrCommandExited
	}
	s.pushStdin(stdinMsg{eof: true})
	return nil
}

// StopCommand only unsubscribes this handle; the process keeps running.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if c == nil {
		return nil
	}
	if s, ok := sessionOf(c); ok {
		s.unsubscribe(c.Stream())
	}
	return nil
}

// ListSessions lists every session of the sandbox, oldest first.
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return nil, err
	}
	ss := slices.SortedFunc(maps.Values(b.sessions), func(a, b *session) int { return a.created.Compare(b.created) })
	out := make([]sandbox.Session, 0, len(ss))
	for _, s := range ss {
		out = append(out, sandbox.Session{ID: s.id, Command: s.command, CreatedAt: s.created})
	}
	return out, nil
}

// Attach replays the session's whole journal to a new command, then its
// terminal verdict if it finished, or subscribes it to live output.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, id string, _ sandbox.AttachOptions) (*sandbox.Command, error) {
	p.mu.Lock()
	b, err := p.lookup(h)
	var s *session
	if err == nil {
		if s = b.sessions[id]; s == nil {
			err = sandbox.ErrNotFound
		}
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cmd, st := sandbox.NewCommand(p, "", private{sandbox: h.Name, session: s})
	cmd.SessionID = s.id
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.buffer {
		if ev.Kind == sandbox.Stdout {
			st.Stdout(ev.Data)
		} else {
			st.Stderr(ev.Data)
		}
	}
	switch {
	case s.exited:
		st.Exit(s.code)
	case s.err != nil:
		st.Fail(s.err)
	default:
		s.subs = append(s.subs, st)
	}
	return cmd, nil
}

// TerminateSession kills the session's process and, if it had not
// finished, records exit 137 and sends it to the current subscribers
// (exactly once, even under concurrent calls). An absent session is nil in
// graceful mode and Unavailable{termination_unconfirmed} in force mode.
func (p *Provider) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, opts sandbox.TerminateOptions) error {
	opts, err := sandbox.ValidateTermination(id, opts)
	if err != nil {
		return err
	}
	p.mu.Lock()
	b, err := p.lookup(h)
	var s *session
	if err == nil {
		s = b.sessions[id]
	}
	p.mu.Unlock()
	if err != nil && err != sandbox.ErrNotFound {
		return err
	}
	if s == nil {
		if opts.Mode == sandbox.Force {
			return sandbox.Unavailable(sandbox.ReasonTerminationUnconfirm, nil)
		}
		return nil
	}
	s.kill()
	s.emit(sandbox.Event{Kind: sandbox.Exit, Code: 137})
	return nil
}
