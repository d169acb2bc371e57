package mcpserver

import (
	"context"
	"io/fs"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func fsMode(m uint64) fs.FileMode { return fs.FileMode(m) & fs.ModePerm }

// progress streams a run's output to its caller as progress
// notifications, when the call carried a progress token: progress is the
// bytes of output so far, message the output since the last one (at most
// progressChunk). The reader never waits for the client: output waits in
// a buffer of progressPending bytes, and what a slow client would have
// pushed past it is dropped from the notifications (the result keeps its
// own copy) and said in the next message.
type progress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	token any

	mu      sync.Mutex
	pending []byte
	dropped int64
	total   int64
	sent    float64
	wake    chan struct{}
	done    chan struct{}
	once    sync.Once
	exited  chan struct{}
}

func newProgress(ctx context.Context, req *mcp.CallToolRequest) *progress {
	p := &progress{}
	if req == nil || req.Session == nil || req.Params == nil {
		return p
	}
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return p
	}
	p.ctx, p.ss, p.token = ctx, req.Session, tok
	p.wake, p.done, p.exited = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go p.loop()
	return p
}

func (p *progress) add(b []byte) {
	if p.ss == nil {
		return
	}
	p.mu.Lock()
	p.total += int64(len(b))
	p.pending = append(p.pending, b...)
	if over := len(p.pending) - progressPending; over > 0 {
		p.dropped += int64(over)
		p.pending = append(p.pending[:0], p.pending[over:]...)
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// stop sends what is pending and ends the notifications; idempotent.
func (p *progress) stop() {
	if p.ss == nil {
		return
	}
	p.once.Do(func() { close(p.done) })
	<-p.exited
}

func (p *progress) loop() {
	defer close(p.exited)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		finishing := false
		select {
		case <-p.wake:
		case <-tick.C:
		case <-p.done:
			finishing = true
		}
		for p.send() {
			// more pending
		}
		if finishing {
			return
		}
	}
}

// send sends one notification of what is pending; it reports whether more
// is left.
func (p *progress) send() bool {
	p.mu.Lock()
	if len(p.pending) == 0 && p.dropped == 0 {
		p.mu.Unlock()
		return false
	}
	n := min(len(p.pending), progressChunk)
	for n > 0 && n < len(p.pending) && !utf8.RuneStart(p.pending[n]) {
		n-- // whole characters in a message
	}
	if n == 0 {
		n = min(len(p.pending), progressChunk)
	}
	msg := string(p.pending[:n])
	if p.dropped > 0 {
		msg = "[" + itoa(p.dropped) + " bytes of output not streamed: the client read too slowly; the result has them]\n" + msg
		p.dropped = 0
	}
	p.pending = append(p.pending[:0], p.pending[n:]...)
	more := len(p.pending) > 0
	prog := float64(p.total - int64(len(p.pending)))
	if prog <= p.sent {
		prog = p.sent + 1e-3 // progress must increase
	}
	p.sent = prog
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), 30*time.Second)
	err := p.ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: prog, Message: msg})
	cancel()
	return more && err == nil
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
