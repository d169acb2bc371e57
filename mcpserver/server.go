package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/sandbox"
)

// Bounds. Every buffer a call holds is one of these; the memory a
// session's calls hold at once is at most MaxCallsPerSession times
// (MaxArgsBytes + 2 × MaxOutputBytes + MaxFileBytes × 4/3), about 45 MiB
// with the defaults, whatever the commands print or the files hold.
const (
	// MaxArgsBytes bounds a call's arguments (a file_write's content
	// with them; base64 takes 4/3 of the bytes). The stdio transport's
	// frame is bounded to MaxArgsBytes + 64 KiB, the HTTP body too.
	MaxArgsBytes = 6 << 20
	// MaxFileBytes bounds what file_read returns and file_write writes
	// in one call (decoded bytes).
	MaxFileBytes = 4 << 20
	// DefaultFileBytes is file_read's max_bytes when none is given.
	DefaultFileBytes = 1 << 20
	// MaxOutputBytes bounds what run keeps of stdout and of stderr each
	// (the rest is read and dropped, counted, and said truncated);
	// DefaultOutputBytes is its max_output_bytes when none is given.
	MaxOutputBytes     = 1 << 20
	DefaultOutputBytes = 64 << 10
	// DefaultTimeout is run's timeout_seconds when none is given;
	// MaxTimeout the most it may be (run longer ones detached).
	DefaultTimeout = 60 * time.Second
	MaxTimeout     = time.Hour
	// MaxSandboxesPerSession bounds the sandboxes one client session
	// holds at once.
	MaxSandboxesPerSession = 8
	// MaxCallsPerSession bounds a session's tool calls under way at
	// once; more wait their turn.
	MaxCallsPerSession = 4
	// MaxListEntries bounds file_list's entries.
	MaxListEntries = 5000
	// progressChunk bounds a progress notification's output text, and
	// progressPending what waits to be sent (older output past it is
	// dropped from the notifications, never from the result).
	progressChunk = 16 << 10
	// streamQueue bounds the output a command's stream queues for this
	// server (half of it: Stream.WaitRoom), below sandbox.StreamLimit.
	streamQueue     = 4 << 20
	progressPending = 64 << 10
)

// The labels every sandbox this server makes carries (where the provider
// keeps labels): the client session's tag, and the owner (Options.Owner).
const (
	LabelSession = "managoat.mcp.session"
	LabelOwner   = "managoat.mcp.owner"
	// NamePrefix starts every sandbox name this server makes:
	// mcp-<session tag>-<4 hex>.
	NamePrefix = "mcp-"
)

// Keeps says which of CreateOptions' per-sandbox settings the provider
// keeps. sandbox_create refuses a setting the provider would drop.
type Keeps struct {
	Image, Env, Labels, Network, Publish bool
}

// KeepsOf is what the named provider keeps: provider/local all of them,
// the platform's client published ports (its local sandboxes'), every
// other none.
func KeepsOf(provider string) Keeps {
	switch provider {
	case "local":
		return Keeps{Image: true, Env: true, Labels: true, Network: true, Publish: true}
	case "platform":
		return Keeps{Publish: true}
	}
	return Keeps{}
}

// Backend is where a client session's sandboxes are made.
type Backend struct {
	Registry *sandbox.Registry
	Provider string // the registry's provider new sandboxes go to
	Keeps    *Keeps // nil: KeepsOf(Provider)
	// Labels are added to every sandbox made (where Keeps.Labels), e.g.
	// LabelOwner.
	Labels map[string]string
	// Close, if set, is called once the session has ended and its
	// sandboxes are destroyed.
	Close func()
}

// Options configure a Server.
type Options struct {
	// Backend is every session's, for a server of one backend (stdio).
	Backend *Backend
	// BackendFor, when Backend is nil, gives each session its backend
	// from the session's first tool call (its HTTP request's TokenInfo
	// and headers: req.Extra).
	BackendFor func(ctx context.Context, req *mcp.CallToolRequest) (*Backend, error)
	// Idle ends a session after this long with no request under way and
	// none received (0: never), destroying its sandboxes; the HTTP
	// transport's SessionTimeout does the same for HTTP sessions.
	Idle   time.Duration
	Logger *slog.Logger
	// Version is reported in the server's implementation info.
	Version string
}

// Server is the MCP server: its tools work on the sandboxes each client
// session made, which are destroyed when the session ends.
type Server struct {
	opts    Options
	mcp     *mcp.Server
	log     *slog.Logger
	maxArgs int
	tools   []string

	mu       sync.Mutex
	sessions map[*mcp.ServerSession]*session
	closed   bool
	wg       sync.WaitGroup
}

// New returns a server with its tools.
func New(o Options) (*Server, error) {
	if o.Backend == nil && o.BackendFor == nil {
		return nil, errors.New("mcpserver: Backend or BackendFor is required")
	}
	if o.Backend != nil && (o.Backend.Registry == nil || o.Backend.Provider == "") {
		return nil, errors.New("mcpserver: Backend needs a Registry and a Provider")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	v := o.Version
	if v == "" {
		v = "dev"
	}
	s := &Server{opts: o, log: log, maxArgs: MaxArgsBytes, sessions: map[*mcp.ServerSession]*session{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "managoat", Title: "managoat sandboxes", Version: v}, &mcp.ServerOptions{
		Instructions: instructions, Logger: log, HasTools: true})
	s.addTools()
	return s, nil
}

const instructions = `managoat gives you sandboxes: isolated machines to run code in, never this host.
sandbox_create makes one (its name is in the result); run runs a command in it (argv, or shell for a sh -c line);
file_write/file_read/file_list/file_delete work on its files; port_publish gives the URL of a published port.
Every sandbox you make is destroyed when this session ends. A failed call's text is {"error":{"kind":...,"message":...}}.`

// MCP is the underlying SDK server (to serve over a transport of one's own).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Tools lists the tools' names in the order they were added.
func (s *Server) Tools() []string { return slices.Clone(s.tools) }

// Run serves one session over t until it ends (the client closes it,
// ctx ends, or it idles out), then destroys the session's sandboxes.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	ss, err := s.mcp.Connect(ctx, t, nil)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = ss.Close() })
	defer stop()
	err = ss.Wait()
	s.end(ss)
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// Close ends every session and destroys their sandboxes; the server
// serves no more.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	ss := slices.Collect(maps.Keys(s.sessions))
	s.mu.Unlock()
	for _, x := range ss {
		_ = x.Close()
	}
	for _, x := range ss {
		s.end(x)
	}
	s.wg.Wait()
}

// session is one client session's state.
type session struct {
	srv   *Server
	ss    *mcp.ServerSession
	tag   string
	b     *Backend
	keeps Keeps
	slots chan struct{}

	endOnce sync.Once

	mu        sync.Mutex
	ended     bool
	sandboxes map[string]*box
	order     []string
	inflight  int
	idle      *time.Timer
}

// box is a sandbox the session made.
type box struct {
	h       *sandbox.Handle
	labels  map[string]string
	publish []int
	created time.Time
	// sessions are the detached runs started in it.
	sessions []string
}

func newTag() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// session returns the state of req's session, made at its first call.
func (s *Server) session(ctx context.Context, req *mcp.CallToolRequest) (*session, error) {
	ss := req.Session
	s.mu.Lock()
	if st := s.sessions[ss]; st != nil {
		s.mu.Unlock()
		return st, nil
	}
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, refuse(KindUnavailable, "closing", "the server is shutting down")
	}
	b := s.opts.Backend
	if b == nil {
		var err error
		if b, err = s.opts.BackendFor(ctx, req); err != nil {
			return nil, err
		}
	}
	keeps := KeepsOf(b.Provider)
	if b.Keeps != nil {
		keeps = *b.Keeps
	}
	st := &session{srv: s, ss: ss, tag: newTag(), b: b, keeps: keeps, slots: make(chan struct{}, MaxCallsPerSession), sandboxes: map[string]*box{}}
	s.mu.Lock()
	if other := s.sessions[ss]; other != nil { // a concurrent first call won
		s.mu.Unlock()
		if b.Close != nil && s.opts.Backend == nil {
			b.Close()
		}
		return other, nil
	}
	s.sessions[ss] = st
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		_ = ss.Wait()
		s.end(ss)
	}()
	return st, nil
}

// acquire takes one of the session's call slots, and holds its idle
// timer while the call is under way.
func (st *session) acquire(ctx context.Context) (func(), error) {
	select {
	case st.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st.mu.Lock()
	st.inflight++
	if st.idle != nil {
		st.idle.Stop()
	}
	st.mu.Unlock()
	return func() {
		st.mu.Lock()
		st.inflight--
		if st.inflight == 0 && st.srv.opts.Idle > 0 && !st.ended {
			if st.idle == nil {
				st.idle = time.AfterFunc(st.srv.opts.Idle, func() {
					st.srv.log.Info("mcp session idle: ending it", "session", st.tag, "idle", st.srv.opts.Idle)
					_ = st.ss.Close()
				})
			} else {
				st.idle.Reset(st.srv.opts.Idle)
			}
		}
		st.mu.Unlock()
		<-st.slots
	}, nil
}

// end destroys the sandboxes of the session ss, once; a second caller
// waits for the first to finish.
func (s *Server) end(ss *mcp.ServerSession) {
	s.mu.Lock()
	st := s.sessions[ss]
	s.mu.Unlock()
	if st == nil {
		return
	}
	st.endOnce.Do(func() {
		st.mu.Lock()
		st.ended = true
		if st.idle != nil {
			st.idle.Stop()
		}
		names := slices.Clone(st.order)
		st.mu.Unlock()
		for _, n := range names {
			_ = st.destroy(n)
		}
		if st.b.Close != nil && s.opts.Backend == nil {
			st.b.Close()
		}
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	})
}

// destroy destroys the session's sandbox name, bounded in time, and
// forgets it.
func (st *session) destroy(name string) error {
	st.mu.Lock()
	b := st.sandboxes[name]
	delete(st.sandboxes, name)
	st.order = slices.DeleteFunc(st.order, func(n string) bool { return n == name })
	st.mu.Unlock()
	if b == nil {
		return refuse(KindNotFound, "sandbox", "sandbox %q is not one of this session's (sandbox_list shows them)", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := st.b.Registry.Destroy(ctx, b.h)
	if err != nil {
		st.srv.log.Warn("mcp: destroy failed", "sandbox", name, "err", err)
	}
	return err
}

// box returns the session's sandbox name, or a not_found naming what the
// session has.
func (st *session) box(name string) (*box, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if b := st.sandboxes[name]; b != nil {
		return b, nil
	}
	have := "none yet: make one with sandbox_create"
	if len(st.order) > 0 {
		have = fmt.Sprint(st.order)
	}
	return nil, refuse(KindNotFound, "sandbox", "sandbox %q is not one of this session's sandboxes (this session has %s)", name, have)
}
