package natshost

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Calls relayed to the replica that holds a runner's socket, and that
// replica's serving of them (onCall), with their encoding on the bus.

// Call implements runner.Caller: on this replica's socket when it holds
// the runner's, else relayed to the replica that does. It is for callers
// that checked the runner's account themselves: relayed, it names the
// account the runner's presence entry records (the holder refuses a call
// naming none), which the holder checks against its socket's as for
// CallAs. A platform's API calls through CallAs.
func (h *Host) Call(ctx context.Context, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	return h.call(ctx, nil, runnerID, req, sub)
}

// CallAs implements runner.AccountCaller: Call on behalf of account. The
// replica holding the runner's socket checks that the runner is
// account's, from the account its socket authenticated as, and refuses
// another's with not_found (runner.ErrNotAccounts), never reaching the
// runner; a relayed call carries the account for that check. An empty
// account owns no runner.
func (h *Host) CallAs(ctx context.Context, account, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	return h.call(ctx, &account, runnerID, req, sub)
}

func (h *Host) call(ctx context.Context, account *string, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	if account != nil && *account == "" {
		return nil, runner.ErrNotAccounts // no account owns a runner for ""
	}
	if c := h.Whereis(runnerID); c != nil {
		if account != nil && *account != c.Info().Account {
			return nil, runner.ErrNotAccounts
		}
		return c.Call(ctx, req, sub)
	}
	oe, err := h.owner(ctx, runnerID)
	if err != nil {
		return nil, err
	}
	owner := oe.Replica
	if owner == "" || owner == h.cfg.Replica {
		return nil, sandbox.Unavailable(runner.ReasonOffline, nil)
	}
	if account == nil {
		account = &oe.Info.Account
	}
	hdr := nats.Header{hdrRunner: []string{runnerID}, hdrAccount: []string{*account}}
	body, err := encodeCall(req, hdr)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		hdr.Set(hdrDeadline, strconv.FormatInt(d.UnixNano(), 10))
	}
	var rem *remote
	if sub != nil {
		rem, err = h.startRemote(owner, sub)
		if err != nil {
			return nil, err
		}
		hdr.Set(hdrInbox, rem.inbox)
		hdr.Set(hdrRelay, rem.id)
		hdr.Set(hdrCaller, h.cfg.Replica)
	}
	data, ahdr, err := h.request(ctx, owner, hdr, body)
	if err != nil {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return nil, sandbox.Unavailable(runner.ReasonTimeout, nil)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		// No responders, or silent while the call waited: the holder is gone.
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, err)
	}
	if code := ahdr.Get(hdrCode); code != "" {
		if rem != nil {
			h.dropRemote(rem, false)
		}
		if code == wire.CodeNotFound && ahdr.Get(hdrDetail) == detailNotAccounts {
			return nil, runner.ErrNotAccounts // as a refusal on this replica reads
		}
		return nil, wire.ErrorFrom(code, ahdr.Get(hdrDetail))
	}
	f, err := wire.Decode(data)
	if err != nil || f.Kind != wire.KindReply {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, fmt.Errorf("natshost: bad reply relayed from replica %s", owner))
	}
	if rem != nil {
		if !f.Reply.OK {
			h.dropRemote(rem, false)
		} else {
			// The stream is installed and its holder sends a keep-alive
			// each interval from now: silence for three ends it.
			rem.timer.Reset(3 * h.cfg.KeepAlive)
		}
	}
	return f.Reply, nil
}

// detailNotAccounts is the holder's refusal of a relayed call for
// another account's runner; the calling replica returns it as
// runner.ErrNotAccounts.
const detailNotAccounts = "no such runner in the caller's account"

// errHolderSilent fails a relayed call whose holder stopped answering
// pings while the call waited.
var errHolderSilent = errors.New("natshost: the replica holding the runner's socket stopped answering")

// request sends a call to replica owner (in parts if large) and waits for
// its answer (in parts if large), on this replica's one response
// subscription (a subscription per call cost a round trip of its own). No
// replica on the subject is nats.ErrNoResponders at once. While it waits
// longer than a keep-alive interval, the owner is pinged each interval: a
// replica that dies with the call in flight (a long exec) fails it after
// three unanswered pings (errHolderSilent), not at its deadline.
func (h *Host) request(ctx context.Context, owner string, hdr nats.Header, data []byte) ([]byte, nats.Header, error) {
	token := nats.NewInbox()[len(nats.InboxPrefix):]
	w := &waiter{wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.waiting[token] = w
	h.mu.Unlock()
	probe := time.NewTimer(h.cfg.KeepAlive)
	pong := make(chan bool, 1)
	pctx, stopProbe := context.WithCancel(ctx)
	probing, misses := false, 0
	defer func() {
		probe.Stop()
		stopProbe()
		if probing {
			<-pong
		}
		h.mu.Lock()
		delete(h.waiting, token)
		h.mu.Unlock()
	}()
	if err := h.publish(h.subject("call", owner), h.respPrefix+token, classRequest, hdr, data); err != nil {
		return nil, nil, err
	}
	var asm assembler
	for {
		select {
		case <-w.wake:
			msgs, err := w.take()
			if err != nil {
				return nil, nil, err
			}
			for _, m := range msgs {
				if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
					return nil, nil, nats.ErrNoResponders
				}
				out, whole, err := asm.add(m)
				if err != nil {
					return nil, nil, err
				}
				if !whole {
					continue
				}
				// Only the holder's sealed answer is taken; anything
				// else on this subject (a NATS user who saw it) is
				// skipped.
				ahdr, adata, _, err := h.seal.open(out, m.Subject, "", classAnswer)
				if err != nil {
					h.badMessage(m.Subject, err)
					continue
				}
				return adata, ahdr, nil
			}
		case <-probe.C:
			probing = true
			go func() { pong <- h.alive(pctx, owner) }()
		case ok := <-pong:
			probing = false
			if ok {
				misses = 0
			} else if misses++; misses >= 3 {
				return nil, nil, errHolderSilent
			}
			probe.Reset(h.cfg.KeepAlive)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// waiter holds the messages of one call's answer until its caller takes
// them: an answer in parts can be hundreds of messages arriving faster
// than the caller reassembles them (a fixed-size channel dropped the
// excess, and the call waited for its deadline). What it holds is bounded
// by maxAssembling bytes.
type waiter struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	bytes int
	over  bool          // the bound was passed: the answer is lost
	wake  chan struct{} // a token when msgs grew
}

var errAnswerTooLarge = errors.New("natshost: a relayed answer exceeded the reassembly bound")

// take returns the messages held since the last take, or
// errAnswerTooLarge once the bound was passed.
func (w *waiter) take() ([]*nats.Msg, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over {
		return nil, errAnswerTooLarge
	}
	msgs := w.msgs
	w.msgs, w.bytes = nil, 0
	return msgs, nil
}

// onResponse hands an answer (or a part of one) to the call waiting for it.
func (h *Host) onResponse(m *nats.Msg) {
	token := m.Subject[len(h.respPrefix):]
	h.mu.Lock()
	w := h.waiting[token]
	h.mu.Unlock()
	if w == nil {
		return // the caller gave up
	}
	w.mu.Lock()
	if w.bytes+len(m.Data) > maxAssembling {
		w.over = true
	} else {
		w.msgs = append(w.msgs, m)
		w.bytes += len(m.Data)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// onCall runs a relayed call on this replica's socket.
func (h *Host) onCall(m *nats.Msg) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		sealed, whole, err := h.calls.add(m)
		if err != nil {
			h.badMessage(m.Subject, err)
			return
		}
		if !whole {
			return // more parts to come
		}
		// Only a replica's call is served, once: one that is not sealed
		// with the cluster key (or was opened before: a replay, or a
		// stale one) is dropped unanswered.
		hdr, data, _, err := h.seal.open(sealed, m.Subject, m.Reply, classRequest)
		if err != nil {
			h.badMessage(m.Subject, err)
			return
		}
		fail := func(code, detail string) {
			if m.Reply != "" {
				_ = h.publish(m.Reply, "", classAnswer, nats.Header{hdrCode: []string{code}, hdrDetail: []string{detail}}, nil)
			}
		}
		req, err := decodeCall(data, hdr)
		if err != nil {
			h.badMessage(m.Subject, err)
			fail(wire.CodeInvalid, "bad relayed call")
			return
		}
		c := h.whereisSettled(hdr.Get(hdrRunner))
		if c == nil {
			fail(wire.CodeUnavailable, runner.ReasonOffline)
			return
		}
		// The call names its account, which must be the runner's: this
		// replica authenticated the runner's socket and does not take
		// the calling replica's word that it checked. A call naming no
		// account, or several, is refused.
		if acct := hdr[hdrAccount]; len(acct) != 1 || acct[0] == "" || acct[0] != c.Info().Account {
			fail(wire.CodeNotFound, detailNotAccounts)
			return
		}
		ctx := context.Background()
		if d, err := strconv.ParseInt(hdr.Get(hdrDeadline), 10, 64); err == nil && d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.Unix(0, d))
			defer cancel()
		}
		var rl *relay
		if inbox := hdr.Get(hdrInbox); inbox != "" {
			rl = &relay{id: hdr.Get(hdrRelay), caller: hdr.Get(hdrCaller), conn: c, inbox: inbox, done: make(chan struct{}), wake: make(chan struct{}, 1)}
			rl.sub = runner.NewFrameSubscription(func(f *wire.Stream) { h.relayFrame(rl, f) })
			h.mu.Lock()
			h.relays[rl.id] = rl
			h.mu.Unlock()
		}
		var sub *runner.Subscription
		if rl != nil {
			sub = rl.sub
		}
		reply, err := c.Call(ctx, req, sub)
		if err != nil {
			if rl != nil {
				h.endRelay(rl)
			}
			fail(wire.ErrorCode(err))
			return
		}
		if rl != nil && (!reply.OK || rl.sub.SessionID() == "") {
			h.endRelay(rl)
			rl = nil
		}
		if rl != nil {
			h.wg.Add(1)
			go h.forward(rl)
		}
		if m.Reply != "" {
			_ = h.publish(m.Reply, "", classAnswer, nil, encodeReply(reply))
		}
	}()
}

// hdrDataAt, on a relayed call, is where in its data the request's JSON
// ends and its data field's base64 text begins: a large data field
// travels beside the JSON, so that the holder neither decodes it from
// JSON nor encodes it again (wire.Request.SetRawData). Relaying a 16 MiB
// write_file spent a quarter of its CPU there.
const hdrDataAt = "Managoat-Data-At"

// rawDataOver is the size from which a request's data travels beside it.
const rawDataOver = 64 << 10

// encodeCall is a relayed call's data: req's JSON, or with a large data
// field, req's JSON without it followed by its text (hdrDataAt, set in hdr).
func encodeCall(req *wire.Request, hdr nats.Header) ([]byte, error) {
	if req.Data == nil || len(*req.Data) < rawDataOver {
		return req.Encode()
	}
	bare := *req
	bare.Data = nil
	b, err := bare.Encode()
	if err != nil {
		return nil, err
	}
	hdr.Set(hdrDataAt, strconv.Itoa(len(b)))
	return append(b, *req.Data...), nil
}

// decodeCall is encodeCall's inverse; data that is not base64 text is an
// error (it goes into the runner's frame as it is).
func decodeCall(data []byte, hdr nats.Header) (*wire.Request, error) {
	at := hdr.Get(hdrDataAt)
	if at == "" {
		return wire.DecodeRequest(data)
	}
	n, err := strconv.Atoi(at)
	if err != nil || n < 0 || n > len(data) {
		return nil, fmt.Errorf("natshost: bad %s %q", hdrDataAt, at)
	}
	req, err := wire.DecodeRequest(data[:n])
	if err != nil {
		return nil, err
	}
	if err := req.SetRawData(data[n:]); err != nil {
		return nil, err
	}
	return req, nil
}

// encodeReply is a reply as the runner framed it.
func encodeReply(r *wire.Reply) []byte {
	if r.OK {
		return wire.AppendOK(nil, r.ID, r.Result)
	}
	return wire.AppendError(nil, r.ID, r.Error, r.Detail)
}

// badMessage logs the first malformed message this replica receives
// (later ones are dropped quietly: a flood must not flood the log).
func (h *Host) badMessage(subject string, err error) {
	h.mu.Lock()
	first := !h.badMsgs
	h.badMsgs = true
	h.dropped++
	h.mu.Unlock()
	if first {
		h.log.Warn("natshost: malformed message dropped (later ones are dropped without a word)", "subject", subject, "err", err)
	}
}
