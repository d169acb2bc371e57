package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// ErrAlreadyRegistered is Host.Register's refusal of a second connection
// for one runner id.
var ErrAlreadyRegistered = errors.New("runner: already registered")

// Info describes a connected runner: identity from the handshake's query
// string, the account the authenticator named, and the extra capabilities
// its provider offers.
type Info struct {
	ID       string   `json:"id"`
	Account  string   `json:"account,omitempty"`
	Name     string   `json:"name"`
	Hostname string   `json:"hostname,omitempty"`
	OS       string   `json:"os,omitempty"`
	Arch     string   `json:"arch,omitempty"`
	Version  string   `json:"version,omitempty"`
	Root     string   `json:"root,omitempty"`
	Caps     []string `json:"caps,omitempty"`
	// Meta is the application's own (ServerConfig.Meta): opaque to this
	// package, which never reads it, and returned as it was given.
	Meta map[string]string `json:"meta,omitempty"`
	// Labels are the runner's own (the handshake's labels parameter, the
	// daemon's --label), which placement selects by.
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity is the runner's latest capacity report (wire.OpCapacity,
	// asked at connection and at each heartbeat), nil from a daemon that
	// does not report one; CapacityAt is when it was received.
	Capacity    *wire.Capacity `json:"capacity,omitempty"`
	CapacityAt  time.Time      `json:"capacity_at,omitzero"`
	ConnectedAt time.Time      `json:"connected_at"`
	LastSeen    time.Time      `json:"last_seen_at"`
}

// HasCap reports whether the runner advertised capability c.
func (i Info) HasCap(c string) bool { return slices.Contains(i.Caps, c) }

// Host is what the platform end needs from its application that is not
// protocol: where a runner's connection lives, who is online, and where
// heartbeats and presence go. A cluster-wide host makes a connection
// reachable from every node; LocalHost is the single-process one.
type Host interface {
	// Register claims id for c; a second claim is ErrAlreadyRegistered.
	Register(id string, c *Conn) error
	// Unregister releases id if c holds it.
	Unregister(id string, c *Conn)
	// Whereis returns the connection registered for id, or nil.
	Whereis(id string) *Conn
	// Online lists every registered runner.
	Online() []Info
	// Heartbeat is called every heartbeat interval (e.g. stamp last_seen).
	Heartbeat(id string)
	// Presence is called after a registration (online) and after an
	// unregistration (offline), so a listener checking online status on the
	// notice sees the truth.
	Presence(info Info, online bool)
}

// Deleter is a Host that can close a runner's socket wherever in a
// cluster it is connected (with 4404 "runner deleted"); DeleteRunner
// reports false when no runner of that id and account is online. The
// Server's DELETE uses it when its Host has it.
type Deleter interface {
	DeleteRunner(id, account string) bool
}

// RunnerAccounter is a Caller that can tell a runner's account without
// listing every runner (the platform checks it before each call).
type RunnerAccounter interface {
	RunnerAccount(ctx context.Context, id string) (account string, online bool)
}

// AccountCaller is a Caller that calls a runner on behalf of an account:
// a runner that is not that account's is refused with ErrNotAccounts
// (sandbox.ErrNotFound: another account's sandbox is 404, never 403) by
// whoever holds the runner's socket, so the check is made where the
// runner's authenticated account is known, also when the call travels to
// another replica of a cluster (provider/runner/natshost). An empty
// account owns no runner.
type AccountCaller interface {
	CallAs(ctx context.Context, account, runnerID string, req *wire.Request, sub *Subscription) (*wire.Reply, error)
}

// ErrNotAccounts is an AccountCaller's refusal of a runner of another
// account: it is sandbox.ErrNotFound.
var ErrNotAccounts = fmt.Errorf("runner: no such runner in the caller's account: %w", sandbox.ErrNotFound)

// LocalHost is a single-process Host: a map under a lock.
type LocalHost struct {
	// OnPresence, if set, is called on every presence change.
	OnPresence func(info Info, online bool)

	mu    sync.Mutex
	conns map[string]*Conn
	seen  map[string]time.Time
}

// NewLocalHost returns an empty LocalHost.
func NewLocalHost() *LocalHost {
	return &LocalHost{conns: map[string]*Conn{}, seen: map[string]time.Time{}}
}

// Register implements Host.
func (h *LocalHost) Register(id string, c *Conn) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns == nil {
		h.conns, h.seen = map[string]*Conn{}, map[string]time.Time{}
	}
	if _, ok := h.conns[id]; ok {
		return ErrAlreadyRegistered
	}
	h.conns[id] = c
	h.seen[id] = time.Now()
	return nil
}

// Unregister implements Host.
func (h *LocalHost) Unregister(id string, c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[id] == c {
		delete(h.conns, id)
		delete(h.seen, id)
	}
}

// Whereis implements Host.
func (h *LocalHost) Whereis(id string) *Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[id]
}

// Online implements Host: every registered runner, most recently connected
// first.
func (h *LocalHost) Online() []Info {
	h.mu.Lock()
	out := make([]Info, 0, len(h.conns))
	for id, c := range h.conns {
		i := c.Info()
		i.LastSeen = h.seen[id]
		out = append(out, i)
	}
	h.mu.Unlock()
	SortByConnected(out)
	return out
}

// SortByConnected orders runners most recently connected first, then by name.
func SortByConnected(rs []Info) {
	slices.SortFunc(rs, func(a, b Info) int {
		if c := b.ConnectedAt.Compare(a.ConnectedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// Heartbeat implements Host: it stamps the runner's last-seen time.
func (h *LocalHost) Heartbeat(id string) {
	h.mu.Lock()
	if _, ok := h.conns[id]; ok {
		h.seen[id] = time.Now()
	}
	h.mu.Unlock()
}

// Presence implements Host.
func (h *LocalHost) Presence(info Info, online bool) {
	if h.OnPresence != nil {
		h.OnPresence(info, online)
	}
}

// Delete forgets a runner: its live socket, if any, is closed with 4404
// "runner deleted". It reports whether a connection was closed.
func (h *LocalHost) Delete(id string) bool {
	c := h.Whereis(id)
	if c == nil {
		return false
	}
	c.Close(wire.CloseDeleted, "runner deleted")
	return true
}
