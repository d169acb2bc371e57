package runner

// Sessions and their output: spawn, attach, the pump that sends a
// session's output to the attached connection, and session ids on the wire.

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

func (d *Daemon) spawn(c *conn, h *sandbox.Handle, req *wire.Request) error {
	opts := sandbox.SpawnOptions{Env: envPairs(req.Env), Dir: deref(req.Dir), Stdin: req.Stdin, Detachable: true}
	cmd := sandbox.Cmd{Name: req.Cmd, Args: req.Args}
	up, err := d.p.Spawn(c.ctx, h, cmd, opts)
	if err != nil {
		return err
	}
	sid := up.SessionID
	durable := sid != "" && d.p.Capabilities().Has(sandbox.CapAttach)
	if sid == "" {
		sid = fmt.Sprintf("s-%d-%d", time.Now().Unix(), d.seq.Add(1))
	}
	sid = wireID(h.Name, sid)
	s := d.adopt(sid, h.Name, cmd.String(), up, durable)
	if s == nil {
		_ = up.Stop()
		return sandbox.Unavailable("shutting_down", nil)
	}
	res, _ := marshal(map[string]string{"session_id": sid})
	if _, err := s.attach(c.ctx, c, req.ID, res, nil); err != nil {
		return err
	}
	d.prune(h.Name)
	return errReplied
}

// adopt registers an upstream command as a session and starts its pump.
func (d *Daemon) adopt(id, name, command string, up *sandbox.Command, durable bool) *session {
	s := &session{d: d, id: id, name: name, command: command, created: time.Now(), up: up, durable: durable}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	if old := d.sessions[id]; old != nil && !old.isDropped() {
		d.mu.Unlock()
		_ = up.Stop()
		return old
	}
	d.sessions[id] = s
	d.wg.Add(1)
	d.mu.Unlock()
	go s.pump(up, 0)
	return s
}

// lookup finds a session of sandbox name, recovering one the daemon does
// not hold (after a restart, or pruned) through the provider's Attach. id
// is a wire id (wireID), or the provider's own id of a session of name; a
// session of another sandbox is never found, whatever id says.
func (d *Daemon) lookup(ctx context.Context, name, id string) (*session, error) {
	// A request that names no sandbox reaches no session: every platform
	// names it in stdin, stdin_close and attach.
	if name == "" || id == "" {
		return nil, sandbox.ErrNotFound
	}
	key, err := wireKey(name, id)
	if err != nil {
		return nil, sandbox.ErrNotFound
	}
	d.mu.Lock()
	s := d.sessions[key]
	d.mu.Unlock()
	if s != nil && !s.isDropped() && s.name == name {
		return s, nil
	}
	if !d.p.Capabilities().Has(sandbox.CapAttach) {
		return nil, sandbox.ErrNotFound
	}
	sid, err := providerSID(name, id)
	if err != nil {
		return nil, sandbox.ErrNotFound
	}
	if err := sandbox.ValidateSessionID(sid); err != nil {
		return nil, sandbox.ErrNotFound
	}
	h, err := d.handle(name)
	if err != nil {
		return nil, err
	}
	d.recoMu.Lock()
	defer d.recoMu.Unlock()
	d.mu.Lock()
	s = d.sessions[key]
	d.mu.Unlock()
	if s != nil && !s.isDropped() && s.name == name {
		return s, nil
	}
	up, err := d.p.Attach(ctx, h, sid, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		return nil, err
	}
	s = d.adopt(key, name, "", up, true)
	if s == nil {
		_ = up.Stop()
		return nil, sandbox.Unavailable("shutting_down", nil)
	}
	return s, nil
}

// Session ids on the wire. A provider numbers the sessions of each sandbox
// on its own (the local provider's are s1, s2, ... in every sandbox), but
// the platform routes stream frames by session_id alone, per connection:
// the daemon therefore puts on the wire the provider's id (or one it made
// up, s-<unix>-<seq>, for a provider that names none) followed by "--"
// and wire.SandboxTag of the sandbox's name, unique on this daemon, and
// takes a request's id back only for the sandbox the request names. (Fountain's
// daemon's ids were s-<unix>-<seq>, unique by construction; its platform
// treats them as opaque, so these need no change there.)
const wireSep = "--"

// wireID is the wire id of the provider's session sid of sandbox name.
func wireID(name, sid string) string { return sid + wireSep + wire.SandboxTag(name) }

// providerSID is the provider's id of wire id id, which must belong to
// sandbox name (or carry no sandbox tag: a provider's own id).
func providerSID(name, id string) (string, error) {
	i := strings.LastIndex(id, wireSep)
	if i < 0 || len(id)-i-len(wireSep) != 16 {
		return id, nil
	}
	if id[i+len(wireSep):] != wire.SandboxTag(name) {
		return "", sandbox.ErrNotFound
	}
	return id[:i], nil
}

// wireKey is the daemon's key of a session of name called id by a request
// (a wire id, or the provider's own id): always tagged with name.
func wireKey(name, id string) (string, error) {
	sid, err := providerSID(name, id)
	if err != nil {
		return "", err
	}
	return wireID(name, sid), nil
}

// forget drops the sessions of a destroyed sandbox from memory. Running
// ones are kept until their upstream ends (the provider's destroy ends
// them), so an attached listener still gets the terminal event.
func (d *Daemon) forget(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, s := range d.sessions {
		if s.name != name {
			continue
		}
		s.mu.Lock()
		s.gone = true
		if s.ended {
			delete(d.sessions, id)
		}
		s.mu.Unlock()
	}
}

// maxFinished is how many finished sessions per sandbox the daemon keeps in
// memory; the provider keeps them all.
const maxFinished = 100

func (d *Daemon) prune(name string) {
	d.mu.Lock()
	var done []*session
	for _, s := range d.sessions {
		if s.name == name && s.finished() {
			done = append(done, s)
		}
	}
	if len(done) <= maxFinished {
		d.mu.Unlock()
		return
	}
	sort.Slice(done, func(i, j int) bool { return done[i].created.Before(done[j].created) })
	for _, s := range done[:len(done)-maxFinished] {
		delete(d.sessions, s.id)
	}
	d.mu.Unlock()
}

// maxJournal bounds the output a session keeps in the daemon's memory
// while a listener is attached (a variable for tests). Past it, a durable
// session's journal is dropped (the provider keeps the whole journal on
// disk), and the next attach swaps in a fresh upstream from the provider's
// Attach, which replays from byte zero (see session.attach); a session the
// provider cannot give back keeps its first maxJournal bytes and refuses
// a later attach with unavailable/replay_unavailable rather than replay a
// part. So the daemon holds at most maxJournal bytes per attached session,
// whatever the session writes (1.5 GB of output used to take 1.5 GB).
var maxJournal = 8 << 20

// session is one journaled upstream command.
//
// Output positions: live counts the output bytes (stdout and stderr as
// one sequence) sent live so far. When a session's journal was trimmed and
// another listener attaches, the daemon takes a new upstream from the
// provider's Attach (generation gen+1) and ignores the old one's events
// from then on; the new upstream replays from byte zero, and its bytes
// below live, which every earlier listener already has, go to the new
// listener alone (tagged replay_for its request, catchup), while its bytes
// from live on are live for all. The provider's replay of a session is the
// same byte sequence as its live output (provider/local reads both from
// its journal), so nothing is lost or sent twice.
type session struct {
	d                 *Daemon
	id, name, command string
	created           time.Time
	stdinMu           sync.Mutex
	mu                sync.Mutex
	up                *sandbox.Command // guarded by mu: a trimmed session's attach replaces it
	gen               int              // which upstream's events count
	upPos             int64            // output bytes the current upstream has delivered
	live              int64            // output bytes sent live
	catchup           int64            // request id whose replay the current upstream delivers, 0 when caught up
	caughtUp          chan struct{}    // closed when catchup returns to 0
	journal           []sandbox.Event
	journalBytes      int
	trimmed           bool  // the journal passed maxJournal and was dropped
	out               *conn // the attached connection, nil when detached
	exited, ended     bool
	gone              bool
	// durable: the provider can give this session back through Attach, so
	// the daemon may drop it from memory while nobody listens (dropped).
	durable, dropped    bool
	code                int
	lastActivityUnixSec atomic.Int64
	// from: the output bytes an attach at an offset (wire.CapAttachOffset)
	// does not want, still to drop from what is sent to its connection.
	from *skip
}

// skip drops the first left output bytes sent to connection c: the bytes
// a listener attached at an offset has (its journal replay, a catch-up or
// live output alike pass through emit), checking that their CRC-32C is
// want. A replay that differs (the session is not the one the listener
// read, or its provider's journal dropped what the listener had not read)
// ends the listener's stream with unavailable/replay_mismatch, and
// nothing more of the session goes to c.
type skip struct {
	c         *conn
	left      int64
	sum, want uint32
	replayFor int64
	failed    bool
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// skipped applies s.from to an event for c, under s.mu: it returns the
// event as it is to be sent, and false when nothing is.
func (s *session) skipped(buf []byte, c *conn, ev sandbox.Event) (sandbox.Event, []byte, bool) {
	k := s.from
	if k == nil || k.c != c {
		return ev, buf, true
	}
	if k.failed {
		return ev, buf, false
	}
	mismatch := false
	switch ev.Kind {
	case sandbox.Stdout, sandbox.Stderr:
		n := min(int64(len(ev.Data)), k.left)
		k.sum = crc32.Update(k.sum, castagnoli, ev.Data[:n])
		k.left -= n
		ev.Data = ev.Data[n:]
		if k.left == 0 {
			if k.sum != k.want {
				mismatch = true
			} else {
				s.from = nil
			}
		}
	default:
		// The output ended before the offset the listener had reached.
		mismatch = ev.Terminal()
	}
	if mismatch {
		k.failed = true
		f := wire.Stream{Kind: wire.StreamError, SessionID: s.id, ReplayFor: k.replayFor}
		f.Error, f.Detail = wire.ErrorCode(sandbox.Unavailable("replay_mismatch",
			errors.New("the session's output differs from what the listener had before its offset")))
		buf = wire.AppendStream(buf[:0], &f)
		_ = c.write(buf)
		return ev, buf, false
	}
	return ev, buf, ev.Kind != sandbox.Stdout && ev.Kind != sandbox.Stderr || len(ev.Data) > 0
}

func (s *session) finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func (s *session) upstream() *sandbox.Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up
}

// pump journals the events of upstream generation gen and sends them
// while attached; events of a replaced upstream are ignored.
func (s *session) pump(up *sandbox.Command, gen int) {
	defer s.d.wg.Done()
	var buf []byte
	for ev := range up.Events() {
		s.lastActivityUnixSec.Store(time.Now().Unix())
		s.mu.Lock()
		if s.gen == gen {
			buf = s.record(buf, ev)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	current, gone := s.gen == gen, s.gone
	if current {
		s.caughtUpLocked()
	}
	s.mu.Unlock()
	if current && gone {
		s.d.mu.Lock()
		if s.d.sessions[s.id] == s {
			delete(s.d.sessions, s.id)
		}
		s.d.mu.Unlock()
	}
}

// caughtUpLocked ends a catch-up: the new listener has its replay.
func (s *session) caughtUpLocked() {
	s.catchup = 0
	if s.caughtUp != nil {
		close(s.caughtUp)
		s.caughtUp = nil
	}
}

// record handles one event of the current upstream, under s.mu.
func (s *session) record(buf []byte, ev sandbox.Event) []byte {
	switch {
	case ev.Kind == sandbox.Stdout || ev.Kind == sandbox.Stderr:
		data := ev.Data
		start := s.upPos
		s.upPos += int64(len(data))
		if start < s.live {
			// A swapped-in upstream's replay of what is already out.
			k := min(int64(len(data)), s.live-start)
			if s.catchup != 0 && s.out != nil {
				buf = s.emit(buf, s.out, sandbox.Event{Kind: ev.Kind, Data: data[:k]}, s.catchup)
			}
			data = data[k:]
			if len(data) == 0 {
				if s.upPos == s.live && !s.ended {
					// (An ended session's catch-up ends with its
					// replayed terminal event.)
					s.caughtUpLocked()
				}
				return buf
			}
		}
		s.caughtUpLocked()
		s.live += int64(len(data))
		ev.Data = data
		s.keep(ev)
	case ev.Terminal():
		if s.ended {
			// The replayed end of a session that ended before the swap:
			// only the new listener has not seen it.
			if s.catchup != 0 && s.out != nil {
				buf = s.emit(buf, s.out, ev, s.catchup)
			}
			s.caughtUpLocked()
			return buf
		}
		s.caughtUpLocked()
		if ev.Kind == sandbox.Exit {
			s.exited, s.code = true, ev.Code
		}
		s.ended = true
		s.journal = append(s.journal, ev)
	default:
		return buf
	}
	if s.out != nil {
		buf = s.emit(buf[:0], s.out, ev, 0)
	}
	return buf
}

// keep journals an output event while the journal is under maxJournal.
func (s *session) keep(ev sandbox.Event) {
	if s.trimmed {
		return
	}
	if s.journalBytes+len(ev.Data) > maxJournal {
		s.trimmed = true
		if s.durable {
			s.journal, s.journalBytes = nil, 0
		}
		return
	}
	s.journal = append(s.journal, ev)
	s.journalBytes += len(ev.Data)
}

// emit writes one event as frames (output split into MaxChunk pieces).
func (s *session) emit(buf []byte, c *conn, ev sandbox.Event, replayFor int64) []byte {
	ev, buf, send := s.skipped(buf, c, ev)
	if !send {
		return buf
	}
	f := wire.Stream{SessionID: s.id, ReplayFor: replayFor}
	switch ev.Kind {
	case sandbox.Stdout, sandbox.Stderr:
		f.Kind = wire.StreamStdout
		if ev.Kind == sandbox.Stderr {
			f.Kind = wire.StreamStderr
		}
		data := ev.Data
		for len(data) > 0 {
			n := min(len(data), wire.MaxChunk)
			f.Data = data[:n]
			data = data[n:]
			var err error
			if c.binary {
				if buf, err = wire.AppendBinaryStream(buf[:0], &f); err == nil {
					err = c.writeBinary(buf)
				}
			}
			if !c.binary || errors.Is(err, wire.ErrNotBinary) {
				buf = wire.AppendStream(buf[:0], &f)
				err = c.write(buf)
			}
			if err != nil {
				return buf
			}
		}
		return buf
	case sandbox.Exit:
		f.Kind, f.Code = wire.StreamExit, ev.Code
	case sandbox.Error:
		f.Kind = wire.StreamError
		f.Error, f.Detail = wire.ErrorCode(ev.Err)
	default:
		return buf
	}
	buf = wire.AppendStream(buf[:0], &f)
	_ = c.write(buf)
	return buf
}

// attach writes the reply for request id, replays the journal tagged with
// id, and binds live output to c, all under the session lock: nothing is
// recorded in between, so nothing is missed or sent twice. It reports
// false for a session dropped meanwhile (the caller looks it up again).
// A trimmed durable session is replayed by a fresh upstream from the
// provider instead (see session); a trimmed session the provider cannot
// give back is refused.
func (s *session) attach(ctx context.Context, c *conn, id int64, reply []byte, from *skip) (bool, error) {
	s.mu.Lock()
	trimmed := s.trimmed
	s.mu.Unlock()
	if !trimmed {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.dropped {
			return false, nil
		}
		if c.write(wire.AppendOK(nil, id, reply)) != nil {
			return true, nil
		}
		s.from = from
		var buf []byte
		for _, ev := range s.journal {
			buf = s.emit(buf, c, ev, id)
		}
		s.out = c
		return true, nil
	}
	if !s.durable {
		return false, sandbox.Unavailable("replay_unavailable", fmt.Errorf("the session wrote more than %d bytes and its provider cannot replay it", maxJournal))
	}
	h, err := s.d.handle(s.name)
	if err != nil {
		return false, err
	}
	sid, err := providerSID(s.name, s.id)
	if err != nil {
		return false, err
	}
	for {
		// One catch-up at a time: a second would cut the first one's replay.
		s.mu.Lock()
		wait := s.caughtUp
		s.mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		up, err := s.d.p.Attach(ctx, h, sid, sandbox.AttachOptions{Stdin: true})
		if err != nil {
			return false, err
		}
		if ok, again, err := s.swap(c, id, reply, up, from); !again {
			return ok, err
		}
	}
}

// swap makes up, a fresh upstream from the provider's Attach, the
// session's upstream, with request id's listener catching up from it (see
// session). again: another catch-up began meanwhile; up was stopped.
func (s *session) swap(c *conn, id int64, reply []byte, up *sandbox.Command, from *skip) (ok, again bool, err error) {
	// The new pump counts in the daemon's WaitGroup; take it before s.mu
	// (forget locks d.mu, then a session's mu).
	s.d.mu.Lock()
	closed := s.d.closed
	if !closed {
		s.d.wg.Add(1)
	}
	s.d.mu.Unlock()
	if closed {
		_ = up.Stop()
		return false, false, sandbox.Unavailable("shutting_down", nil)
	}
	// No stdin write is in flight while the upstream changes (one sent to
	// the old upstream as it stops would be lost).
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	s.mu.Lock()
	if s.dropped || s.caughtUp != nil || c.write(wire.AppendOK(nil, id, reply)) != nil {
		dropped, racing := s.dropped, s.caughtUp != nil
		s.mu.Unlock()
		s.d.wg.Done()
		_ = up.Stop()
		// A dropped session is looked up again; a write that failed means
		// the socket is gone, and so is the listener.
		return !dropped, racing && !dropped, nil
	}
	old := s.up
	s.gen++
	s.up, s.upPos, s.catchup, s.caughtUp = up, 0, id, make(chan struct{})
	s.out = c
	s.from = from
	gen := s.gen
	s.mu.Unlock()
	go s.pump(up, gen)
	_ = old.Stop()
	return true, false, nil
}

// detach stops live output to c (the platform's last listener left). A
// durable session is then dropped from the daemon's memory, journal and
// all: the provider keeps running and journaling it, and the next attach or
// stdin takes it back through the provider's Attach, from byte zero. So the
// daemon holds output only for sessions someone is listening to (Fountain's
// daemon held every journal in memory for the daemon's life, D6).
func (s *session) detach(c *conn) {
	s.mu.Lock()
	if s.out == c {
		s.out = nil
	}
	drop := s.out == nil && s.durable && !s.dropped
	if drop {
		s.dropped = true
		s.journal = nil
	}
	s.mu.Unlock()
	if !drop {
		return
	}
	s.d.mu.Lock()
	if s.d.sessions[s.id] == s {
		delete(s.d.sessions, s.id)
	}
	s.d.mu.Unlock()
	_ = s.upstream().Stop()
}

func (s *session) isDropped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *session) closeStdin(ctx context.Context) error {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	return s.upstream().CloseStdin(ctx)
}

func (s *session) writeStdin(ctx context.Context, data []byte) error {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.finished() {
		return sandbox.ErrCommandExited
	}
	err := s.upstream().WriteStdin(ctx, data)
	if err != nil && s.finished() {
		return sandbox.ErrCommandExited
	}
	if err == nil {
		s.lastActivityUnixSec.Store(time.Now().Unix())
	}
	return err
}
