package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
)

// EventKind is the kind of one event of a streaming command.
type EventKind int

// The event kinds. Exit and Error are terminal.
const (
	Stdout EventKind = iota + 1
	Stderr
	Exit
	Error
)

func (k EventKind) String() string {
	switch k {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case Exit:
		return "exit"
	case Error:
		return "error"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one message of a streaming command. Ref is the command's Ref.
// Data is set for Stdout and Stderr, Code for Exit, Err for Error.
type Event struct {
	Kind EventKind
	Ref  string
	Data []byte
	Code int
	Err  error
}

// Terminal reports whether e is an Exit or an Error.
func (e Event) Terminal() bool { return e.Kind == Exit || e.Kind == Error }

// Command is a handle to a streaming command (a spawn or an attach). Its
// Events channel yields output events, then exactly one terminal event (an
// Exit with the real code, or an Error), then is closed. A stream that
// closes without an exit yields Error with ClosedBeforeExit, never Exit 0.
//
// A consumer must either read Events until it is closed or call Stop;
// otherwise the goroutine feeding the channel stays blocked.
type Command struct {
	Provider string
	Ref      string
	// SessionID is the id of the session the command runs in, for
	// ListSessions, Attach and TerminateSession; "" when the provider does
	// not know it (a non-detachable command on some providers).
	SessionID string
	// Private is adapter-owned and never printed.
	Private any

	p      Provider
	stream *Stream

	mu      sync.Mutex
	stopped bool
}

// NewRef returns a fresh random correlation token.
func NewRef() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewCommand is for Provider implementations: it returns a Command owned by
// p with the given ref (NewRef when empty) and private state, and the Stream
// the provider feeds its events into.
func NewCommand(p Provider, ref string, private any) (*Command, *Stream) {
	if ref == "" {
		ref = NewRef()
	}
	s := newStream(ref)
	name := ""
	if p != nil {
		name = p.Name()
	}
	return &Command{Provider: name, Ref: ref, Private: private, p: p, stream: s}, s
}

// Events returns the command's event channel.
func (c *Command) Events() <-chan Event {
	if c == nil || c.stream == nil {
		ch := make(chan Event)
		close(ch)
		return ch
	}
	return c.stream.out
}

// Stream returns the producer end; for Provider implementations.
func (c *Command) Stream() *Stream {
	if c == nil {
		return nil
	}
	return c.stream
}

// Stopped reports whether Stop was called.
func (c *Command) Stopped() bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// Finished reports whether the terminal event has been produced.
func (c *Command) Finished() bool {
	return c == nil || c.stream == nil || c.stream.Terminated()
}

// WriteStdin sends data to the command's stdin. After the command exited,
// or after Stop, it returns ErrCommandExited; it never panics.
func (c *Command) WriteStdin(ctx context.Context, data []byte) error {
	if c == nil || c.p == nil {
		return Invalid(ReasonHandle, "nil or foreign command")
	}
	if c.Stopped() || c.Finished() {
		return ErrCommandExited
	}
	return c.p.WriteStdin(ctx, c, data)
}

// CloseStdin sends end-of-file to the command's stdin. After Stop it
// returns ErrCommandExited.
func (c *Command) CloseStdin(ctx context.Context) error {
	if c == nil || c.p == nil {
		return Invalid(ReasonHandle, "nil or foreign command")
	}
	if c.Stopped() {
		return ErrCommandExited
	}
	return c.p.CloseStdin(ctx, c)
}

// Stop tears down this process's end of the command (a local detach). The
// remote process keeps running; TerminateSession stops it. Stop is
// idempotent and always returns nil. After Stop, Events is closed without a
// terminal event.
func (c *Command) Stop() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	already := c.stopped
	c.stopped = true
	c.mu.Unlock()
	if already {
		return nil
	}
	if c.p != nil {
		_ = c.p.StopCommand(c)
	}
	if c.stream != nil {
		c.stream.Detach()
	}
	return nil
}

// String shows only the provider and the ref.
func (c *Command) String() string {
	if c == nil {
		return "<nil command>"
	}
	return c.Provider + "#" + c.Ref
}

// Format keeps Private out of every verb.
func (c *Command) Format(f fmt.State, verb rune) { fmt.Fprint(f, "Command{"+c.String()+"}") }

// LogValue keeps Private out of slog output.
func (c *Command) LogValue() slog.Value {
	if c == nil {
		return slog.StringValue("<nil>")
	}
	return slog.GroupValue(slog.String("provider", c.Provider), slog.String("ref", c.Ref))
}

// Stream is the producer end of a Command. It enforces the event rules: output
// only before the terminal event, exactly one terminal event, nothing after.
// Sends never block the producer: events queue for the one reader, so a
// slow reader slows only itself, up to a bound (StreamLimit bytes of
// output, SetLimit to change it): a reader that falls further behind is
// dropped and told, its queue freed and the Command ended with
// Unavailable{slow_reader}, so no reader can make a process hold output
// without limit. (A detachable session goes on; attach it again to read
// on from its journal.)
type Stream struct {
	ref string
	out chan Event

	mu       sync.Mutex
	queue    []Event
	queued   int // bytes of output in queue
	limit    int // bound on queued; 0: none
	wake     chan struct{}
	drained  chan struct{} // a token after each event the reader took
	term     bool
	detached bool
	done     chan struct{} // closed at terminal or detach
	detachC  chan struct{} // closed at detach
}

// StreamLimit is how many bytes of output a Stream queues for a reader
// that does not keep up before it drops the reader (ReasonSlowReader).
const StreamLimit = 64 << 20

// ReasonSlowReader is the Unavailable reason of a Command whose reader fell
// more than its Stream's limit behind.
const ReasonSlowReader = "slow_reader"

// SetLimit bounds the output the stream queues for its reader to n bytes
// (0: no bound, for a producer that bounds what it sends itself).
func (s *Stream) SetLimit(n int) {
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
}

func newStream(ref string) *Stream {
	s := &Stream{ref: ref, out: make(chan Event), wake: make(chan struct{}, 1), drained: make(chan struct{}, 1), limit: StreamLimit,
		done: make(chan struct{}), detachC: make(chan struct{})}
	go s.pump()
	return s
}

func (s *Stream) pump() {
	defer close(s.out)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 {
			if s.detached || (s.term && len(s.queue) == 0) {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			<-s.wake
			s.mu.Lock()
		}
		ev := s.queue[0]
		s.queue[0] = Event{}
		s.queue = s.queue[1:]
		s.queued -= len(ev.Data)
		s.mu.Unlock()
		select {
		case s.out <- ev:
		case <-s.detachC:
			return
		}
		select {
		case s.drained <- struct{}{}:
		default:
		}
	}
}

// WaitRoom blocks until the reader has room for n more bytes of output
// (the queue at most half the limit after them), for a producer that can
// wait, such as one that reads a journal on disk: it then never drops its
// reader as slow, and the journal is the buffer. It reports false when
// ctx ends or the stream is detached or terminated; with no limit it does
// not wait.
func (s *Stream) WaitRoom(ctx context.Context, n int) bool {
	for {
		s.mu.Lock()
		dead := s.term || s.detached
		room := s.limit <= 0 || len(s.queue) == 0 || s.queued+n <= s.limit/2
		s.mu.Unlock()
		switch {
		case dead:
			return false
		case room:
			return true
		}
		select {
		case <-s.drained:
		case <-s.detachC:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (s *Stream) send(ev Event) bool {
	s.mu.Lock()
	if s.term || s.detached {
		s.mu.Unlock()
		return false
	}
	ev.Ref = s.ref
	if s.limit > 0 && s.queued+len(ev.Data) > s.limit {
		// The reader fell too far behind: drop it, and say so.
		s.queue, s.queued = nil, 0
		ev = Event{Kind: Error, Ref: s.ref, Err: Unavailable(ReasonSlowReader,
			fmt.Errorf("the reader fell more than %d bytes behind the output", s.limit))}
	}
	s.queue = append(s.queue, ev)
	s.queued += len(ev.Data)
	if ev.Terminal() {
		s.term = true
		close(s.done)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// Stdout queues an output event. It reports false (and drops the data)
// after the terminal event or a detach.
func (s *Stream) Stdout(p []byte) bool {
	if len(p) == 0 {
		return !s.Terminated()
	}
	return s.send(Event{Kind: Stdout, Data: p})
}

// Stderr queues a stderr event.
func (s *Stream) Stderr(p []byte) bool {
	if len(p) == 0 {
		return !s.Terminated()
	}
	return s.send(Event{Kind: Stderr, Data: p})
}

// Exit queues the terminal exit event; later calls are ignored.
func (s *Stream) Exit(code int) bool { return s.send(Event{Kind: Exit, Code: code}) }

// Fail queues the terminal error event; later calls are ignored.
func (s *Stream) Fail(err error) bool {
	if err == nil {
		err = ClosedBeforeExit()
	}
	return s.send(Event{Kind: Error, Err: err})
}

// Close ends a stream whose transport closed: when no terminal event was
// produced it produces Error ClosedBeforeExit, never an exit.
func (s *Stream) Close() { s.Fail(ClosedBeforeExit()) }

// Detach drops queued and future events and closes the channel without a
// terminal event. Command.Stop calls it.
func (s *Stream) Detach() {
	s.mu.Lock()
	if s.detached {
		s.mu.Unlock()
		return
	}
	s.detached = true
	s.queue, s.queued = nil, 0
	if !s.term {
		close(s.done)
	}
	close(s.detachC)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Terminated reports whether the terminal event was produced.
func (s *Stream) Terminated() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.term
}

// Detached reports whether the reader left.
func (s *Stream) Detached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detached
}

// Done is closed when the terminal event is produced or the stream is
// detached, whichever comes first.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Ref returns the stream's correlation token.
func (s *Stream) Ref() string { return s.ref }
