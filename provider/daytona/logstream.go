package daytona

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Stream indexes in the per-stream counters.
const (
	chOut = 0
	chErr = 1
)

// segment is one run of a demultiplexed journal.
type segment struct {
	ch   int
	data []byte
}

// demux splits a journal into its stdout and stderr runs, in order. The
// toolbox multiplexes a session command's stdout and stderr into one byte
// stream, switching with the 3-byte markers 01 01 01 and 02 02 02. Data
// before any marker is stdout; a 01 or 02 byte that does not start a full
// marker is data. Unless final, a trailing run that could still grow into
// a marker (01, 01 01, 02, 02 02) is held back: the next poll decides.
func demux(j []byte, final bool) []segment {
	var segs []segment
	cur, start := chOut, 0
	flush := func(end int) {
		if end > start {
			segs = append(segs, segment{cur, j[start:end]})
		}
	}
	for i := 0; i < len(j); {
		b := j[i]
		if b != 1 && b != 2 {
			i++
			continue
		}
		if i+3 <= len(j) && j[i+1] == b && j[i+2] == b {
			flush(i)
			cur = chOut
			if b == 2 {
				cur = chErr
			}
			i += 3
			start = i
			continue
		}
		if !final && i+3 > len(j) && bytes.Count(j[i:], []byte{b}) == len(j)-i {
			flush(i)
			return segs
		}
		i++
	}
	flush(len(j))
	return segs
}

// cursor is the LogStream's offset arithmetic: how many bytes of each
// stream were delivered. The counts never reset; each poll re-reads the
// whole journal and only the suffix past the count is new.
type cursor struct {
	delivered [2]int
}

// advance returns the new runs of segs (the whole journal, demultiplexed)
// and counts them as delivered. A journal shorter than what was delivered
// (a truncated read) yields nothing and loses nothing.
func (c *cursor) advance(segs []segment) []segment {
	skip := c.delivered
	var out []segment
	for _, s := range segs {
		n := len(s.data)
		if skip[s.ch] >= n {
			skip[s.ch] -= n
			continue
		}
		fresh := s.data[skip[s.ch]:]
		skip[s.ch] = 0
		c.delivered[s.ch] += len(fresh)
		out = append(out, segment{s.ch, fresh})
	}
	return out
}

// legacySegments reads an older daemon's JSON journal {"stdout","stderr"}.
// JSON has already replaced invalid UTF-8 with U+FFFD; a character split by
// the poll shows up as trailing U+FFFDs that the next poll replaces, so
// unless final they are held back rather than delivered and later counted
// wrongly.
func legacySegments(out, errs string, final bool) []segment {
	trim := func(s string) []byte {
		if !final {
			for strings.HasSuffix(s, "\uFFFD") {
				s = strings.TrimSuffix(s, "\uFFFD")
			}
		}
		return []byte(s)
	}
	return []segment{{chOut, trim(out)}, {chErr, trim(errs)}}
}

// logStream polls one session command's journal and feeds its Stream:
// output first (never a byte twice, never one skipped), then exactly one
// terminal event — the real exit code, or an error; never a made-up code.
type logStream struct {
	p            *Provider
	name         string // the sandbox's name, for gone
	tb, sid, cid string
	base         string
	files        bool // read the shim's output files, not the daemon's log
	s            *sandbox.Stream
	cur          cursor
	ctx          context.Context
	cancel       context.CancelFunc
	done         chan struct{}
	stopOnce     sync.Once
	maxFailures  int
	goneConfirm  int
	recordCode   *int // the record's exit code, seen while the shim had no pid
	more         bool // the last read of the files stopped at readChunk
}

// splitOutput asks the daemon to keep the 01 01 01 / 02 02 02 markers in a
// command's log: without it (and without an SDK version header, which this
// client never sends) the daemon strips them, and stderr would arrive as
// stdout (daemon pkg/session/common.go, IsCombinedOutput).
var splitOutput = http.Header{"X-Daytona-Split-Output": {"true"}}

// maxLogFailures is the number of consecutive failed polls tolerated; one
// more ends the stream with Unavailable{log_stream_unreachable}. A poll the
// toolbox refuses for a sandbox that is gone (see gone) ends it at once
// with ErrNotFound.
const maxLogFailures = 30

func (p *Provider) startLogStream(name, tb, sid, cid, base string, files bool, s *sandbox.Stream) *logStream {
	ctx, cancel := context.WithCancel(context.Background())
	ls := &logStream{p: p, name: name, tb: tb, sid: sid, cid: cid, base: base, files: files, s: s, ctx: ctx, cancel: cancel,
		done: make(chan struct{}), maxFailures: maxLogFailures}
	if files {
		go ls.runFiles()
	} else {
		go ls.run()
	}
	return ls
}

// readChunk is the most bytes of each stream one poll of the output files
// reads; a poll that reads that much polls again at once.
const readChunk = 512 << 10

// runFiles polls the shim's output files and its verdict in one
// /process/execute per poll: the output is delivered byte-exact, as
// written, and the verdict only once a read that saw it also read the
// output to its end.
func (ls *logStream) runFiles() {
	defer close(ls.done)
	defer ls.cancel()
	interval := ls.p.cfg.PollMin
	failures := 0
	for {
		fresh, done, err := ls.pollFiles()
		switch {
		case done:
			ls.endSession()
			return
		case err != nil:
			if ls.ctx.Err() != nil {
				return
			}
			if ls.gone(err) {
				ls.s.Fail(sandbox.ErrNotFound)
				return
			}
			failures++
			if failures%10 == 0 {
				ls.p.cfg.Logger.Warn("daytona: session output unreachable", "session", ls.sid, "failures", failures, "err", err)
			}
			if failures > ls.maxFailures {
				ls.s.Fail(sandbox.Unavailable("log_stream_unreachable", err))
				return
			}
		default:
			failures = 0
		}
		if err == nil && ls.more {
			if ls.ctx.Err() != nil {
				return
			}
			continue
		}
		if fresh {
			interval = ls.p.cfg.PollMin
		} else if interval *= 2; interval > ls.p.cfg.PollMax {
			interval = ls.p.cfg.PollMax
		}
		t := time.NewTimer(interval)
		select {
		case <-ls.ctx.Done():
			t.Stop()
			return
		case <-ls.s.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// pollFiles reads what is new and, when the read saw the verdict and the
// output to its end, produces the terminal event (done).
func (ls *logStream) pollFiles() (fresh, done bool, err error) {
	res, code, err := ls.p.execute(ls.ctx, ls.tb, readScript(ls.base, ls.cur.delivered, readChunk), 30)
	if err != nil {
		return false, false, err
	}
	if code != 0 {
		return false, false, &sandbox.ProviderError{Provider: Name, Reason: "session_read_failed", Err: fmt.Errorf("exit %d: %s", code, clip(res, 200))}
	}
	state, sentinel, out, errs, err := parseRead(res)
	if err != nil {
		return false, false, &sandbox.ProviderError{Provider: Name, Reason: "session_read_undecodable", Err: err}
	}
	if len(out) > 0 {
		ls.cur.delivered[chOut] += len(out)
		ls.s.Stdout(out)
	}
	if len(errs) > 0 {
		ls.cur.delivered[chErr] += len(errs)
		ls.s.Stderr(errs)
	}
	fresh = len(out) > 0 || len(errs) > 0
	if ls.more = len(out) == readChunk || len(errs) == readChunk; ls.more {
		return true, false, nil // more to read before any verdict
	}
	if n, err := strconv.Atoi(sentinel); err == nil {
		ls.s.Exit(n)
		return fresh, true, nil
	}
	switch state {
	case "dead":
		ls.s.Fail(sandbox.ClosedBeforeExit())
		return fresh, true, nil
	case "nopid":
		// The shim has not started, or its files are gone: the daemon's
		// record decides (an exit code there, e.g. a shim that could not
		// create its directory; or a session the daemon no longer knows).
		if ls.recordCode != nil {
			// A second read still finds no shim: it never ran.
			ls.s.Exit(*ls.recordCode)
			return fresh, true, nil
		}
		code, ok, gone := ls.recordExit()
		switch {
		case ok:
			// The shim may have run and ended since this read began:
			// read again (now) before believing the record.
			ls.recordCode = &code
			return true, false, nil
		case gone:
			if ls.goneConfirm++; ls.goneConfirm >= 3 {
				ls.s.Fail(sandbox.ClosedBeforeExit())
				return fresh, true, nil
			}
		default:
			ls.goneConfirm = 0
		}
	}
	return fresh, false, nil
}

// gone reports whether err, a failed poll, is the toolbox refusing a
// sandbox that no longer exists: a 401, 403 or 404 (the proxy answers 401
// for a deleted sandbox) after which a GET by name finds it gone. Any
// other failure counts towards maxFailures.
func (ls *logStream) gone(err error) bool {
	if ls.name == "" {
		return false
	}
	return ls.p.refusedAsGone(ls.ctx, ls.name, err)
}

// endSession deletes the daemon's session of a finished command: each
// session holds a shell in the sandbox, and the output and verdict live on
// in the shim's files (ListSessions and Attach read them). Best effort.
func (ls *logStream) endSession() {
	ctx, cancel := context.WithTimeout(context.Background(), ls.p.cfg.Timeout)
	defer cancel()
	ls.p.deleteSession(ctx, ls.tb, ls.sid)
}

// stop ends the poller (a local detach) and waits for it, at most 1 s.
func (ls *logStream) stop() {
	if ls == nil {
		return
	}
	ls.stopOnce.Do(ls.cancel)
	select {
	case <-ls.done:
	case <-time.After(time.Second):
	}
}

func (ls *logStream) run() {
	defer close(ls.done)
	defer ls.cancel()
	interval := ls.p.cfg.PollMin
	failures := 0
	for {
		fresh, err := ls.fetch(false)
		if err != nil {
			if ls.ctx.Err() != nil {
				return
			}
			if ls.gone(err) {
				ls.s.Fail(sandbox.ErrNotFound)
				return
			}
			failures++
			if failures%10 == 0 {
				ls.p.cfg.Logger.Warn("daytona: session journal unreachable", "session", ls.sid, "failures", failures, "err", err)
			}
			if failures > ls.maxFailures {
				ls.s.Fail(sandbox.Unavailable("log_stream_unreachable", err))
				return
			}
		} else {
			failures = 0
		}
		if ls.finish() {
			return
		}
		if fresh {
			interval = ls.p.cfg.PollMin
		} else if interval *= 2; interval > ls.p.cfg.PollMax {
			interval = ls.p.cfg.PollMax
		}
		t := time.NewTimer(interval)
		select {
		case <-ls.ctx.Done():
			t.Stop()
			return
		case <-ls.s.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// fetch reads the whole journal and delivers what is new. It reports
// whether anything was delivered.
func (ls *logStream) fetch(final bool) (bool, error) {
	r, err := ls.get()
	if err != nil {
		return false, err
	}
	return ls.deliver(r, final)
}

func (ls *logStream) get() (*response, error) {
	u := ls.tb + "/process/session/" + url.PathEscape(ls.sid) + "/command/" + url.PathEscape(ls.cid) + "/logs"
	return ls.p.c.callWith(ls.ctx, http.MethodGet, u, nil, reqOpts{header: splitOutput})
}

// deliver demultiplexes a journal and sends what the cursor has not seen.
func (ls *logStream) deliver(r *response, final bool) (bool, error) {
	var segs []segment
	if isJSON(r.header) {
		var m struct {
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		}
		if err := json.Unmarshal(r.body, &m); err != nil {
			return false, &sandbox.ProviderError{Provider: Name, Reason: "journal_undecodable", Err: err}
		}
		segs = legacySegments(m.Stdout, m.Stderr, final)
	} else {
		segs = demux(r.body, final)
	}
	fresh := ls.cur.advance(segs)
	for _, s := range fresh {
		if s.ch == chErr {
			ls.s.Stderr(s.data)
		} else {
			ls.s.Stdout(s.data)
		}
	}
	return len(fresh) > 0, nil
}

// drain reads the journal of an ended command until two reads in a row
// agree — a finished journal no longer changes, so a read that raced the
// writer or came back cut cannot pass for the end (a server that serves the
// same truncated journal twice in a row would defeat it; none is known) —
// and delivers the rest. It
// gives up on a 404 (the journal is gone) or after as many consecutive
// failures as the poller tolerates.
func (ls *logStream) drain() {
	var prev []byte
	failures := 0
	for {
		r, err := ls.get()
		switch {
		case err != nil:
			if ls.ctx.Err() != nil || errors.Is(err, sandbox.ErrNotFound) {
				return
			}
			if failures++; failures > ls.maxFailures {
				return
			}
		case prev != nil && bytes.Equal(prev, r.body):
			_, _ = ls.deliver(r, true)
			return
		default:
			_, _ = ls.deliver(r, false)
			prev = r.body
		}
		t := time.NewTimer(ls.p.cfg.PollMin)
		select {
		case <-ls.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func isJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// finish checks whether the command ended and, if so, drains the journal
// once more and produces the terminal event. The command record's integer
// exitCode wins; otherwise the shim's sentinel. A shim that died without
// writing one ends the stream with ClosedBeforeExit. Failed checks are
// transient: the next poll checks again.
func (ls *logStream) finish() bool {
	code, ok, gone := ls.recordExit()
	state := ""
	if !ok {
		code, ok, state = ls.probe()
	}
	dead := state == "dead"
	gone = gone && state == "nopid"
	switch {
	case ok:
		ls.drain()
		ls.s.Exit(code)
		return true
	case dead:
		ls.drain()
		ls.s.Fail(sandbox.ClosedBeforeExit())
		return true
	case gone:
		// The session is unknown to the toolbox (the daemon restarted or
		// the sandbox went away) and the sentinel has no verdict yet: after
		// a few confirmations there is nothing left to wait for.
		ls.goneConfirm++
		if ls.goneConfirm >= 3 {
			ls.drain()
			ls.s.Fail(sandbox.ClosedBeforeExit())
			return true
		}
	default:
		ls.goneConfirm = 0
	}
	return false
}

// recordExit reads the command record: ok with an integer exitCode; gone
// when the toolbox answers 404.
func (ls *logStream) recordExit() (code int, ok, gone bool) {
	u := ls.tb + "/process/session/" + url.PathEscape(ls.sid) + "/command/" + url.PathEscape(ls.cid)
	r, err := ls.p.c.call(ls.ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, errors.Is(err, sandbox.ErrNotFound)
	}
	var m struct {
		ExitCode *json.Number `json:"exitCode"`
	}
	d := json.NewDecoder(bytes.NewReader(r.body))
	d.UseNumber()
	if d.Decode(&m) != nil || m.ExitCode == nil {
		return 0, false, false
	}
	n, err := strconv.Atoi(m.ExitCode.String())
	if err != nil {
		return 0, false, false
	}
	return n, true, false
}

// probe reads the shim's liveness (alive, dead, nopid; "" when the probe
// failed) and its sentinel through one execute. A sentinel that is not an
// integer is ignored.
func (ls *logStream) probe() (code int, ok bool, state string) {
	if ls.base == "" {
		return 0, false, ""
	}
	res, exit, err := ls.p.execute(ls.ctx, ls.tb, probeScript(ls.base), 15)
	if err != nil || exit != 0 {
		return 0, false, ""
	}
	state, rest, _ := strings.Cut(res, "\n")
	state = strings.TrimSpace(state)
	if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
		return n, true, state
	}
	return 0, false, state
}
