package sprites

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// The bounded operations' limits (spec §6.1.7, §6.1.8, §6.1.10, §6.1.12).
const (
	boundedBodyCap     = 64 << 10 // create_new, destroy_once (per response), checkpoint (both responses together)
	terminationBodyCap = 16 << 10
	maxBoundedTimeout  = 120 * time.Second

	defaultCreateNewTimeout  = 120 * time.Second
	defaultDestroyOnceTime   = 30 * time.Second
	defaultCheckpointTimeout = 30 * time.Second
	terminationGrace         = 5 * time.Second
)

// The reasons of the bounded operations' Unavailable and Invalid errors.
const (
	ReasonCreateTimeout          = "create_timeout"
	ReasonCreateUnconfirmed      = "create_unconfirmed"
	ReasonCreateTransportFailed  = "create_transport_failed"
	ReasonDeleteTimeout          = "delete_timeout"
	ReasonDeleteUnconfirmed      = "delete_unconfirmed"
	ReasonDeleteTransportFailed  = "delete_transport_failed"
	ReasonTerminationTimeout     = "termination_timeout"
	ReasonTerminationTransport   = "termination_transport_failed"
	ReasonCheckpointTimeout      = "checkpoint_timeout"
	ReasonCheckpointUnconfirmed  = "checkpoint_unconfirmed"
	ReasonCheckpointTransport    = "checkpoint_transport_failed"
	ReasonCheckpointOperationID  = "checkpoint_operation_id"
	ReasonTerminationUnconfirmed = sandbox.ReasonTerminationUnconfirm
)

func unavailable(reason string) error { return &sandbox.UnavailableError{Reason: reason} }

// bounded runs fn once under its own deadline, in a goroutine that is not
// tied to the caller: the request is torn down at the deadline even if the
// caller has gone, and never later. The caller waits for the result, the
// deadline or its own context, whichever comes first; the last two are
// timeoutReason (uncertain: nothing is claimed undone). A panic inside fn
// is panicReason, with no detail. A caller context already done before
// anything was sent is returned as is: nothing happened.
func bounded[T any](ctx context.Context, timeout time.Duration, timeoutReason, panicReason string,
	fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer cancel()
		defer func() {
			if recover() != nil {
				ch <- result{err: unavailable(panicReason)}
			}
		}()
		v, err := fn(octx)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-octx.Done():
		select {
		case r := <-ch:
			return r.v, r.err
		default:
			return zero, unavailable(timeoutReason)
		}
	case <-ctx.Done():
		return zero, &sandbox.UnavailableError{Reason: timeoutReason, Err: ctx.Err()}
	}
}

// once sends one request over the bounded transport: HTTP/1 only, a fresh
// connection, no redirect followed, no retry, no compression.
func (p *Provider) once(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	p.authorize(req)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := &http.Client{Transport: p.bounded, CheckRedirect: noRedirect}
	return c.Do(req)
}

// readCapped reads at most limit bytes of r and closes it; over reports a
// body longer than limit, of which no more is read.
func readCapped(r io.ReadCloser, limit int64) (b []byte, over bool, err error) {
	defer r.Close()
	if limit < 0 {
		limit = 0
	}
	b, err = io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(b)) > limit {
		return b[:limit], true, nil
	}
	return b, false, err
}

func checkBoundedTimeout(t, def time.Duration, reason string) (time.Duration, error) {
	if t == 0 {
		return def, nil
	}
	if t < time.Millisecond || t > maxBoundedTimeout {
		return 0, sandbox.Invalid(reason, "timeout "+t.String()+" is outside 1ms..120s")
	}
	return t, nil
}

// CreateNew is one creation attempt that never adopts (spec §6.1.7): one
// POST, no retry, no redirect, at most Timeout (default 120 s, 1 ms–120 s)
// and 64 KiB. 409 is ErrAlreadyExists; a 2xx must be a JSON object naming
// the sprite with an id of 1–256 bytes, else Unavailable{create_unconfirmed};
// other statuses go through the §3.2 table with no body; a timeout is
// Unavailable{create_timeout}, a transport failure
// Unavailable{create_transport_failed}. Provider text never appears.
func (p *Provider) CreateNew(ctx context.Context, name string, opts sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	timeout, err := checkBoundedTimeout(opts.Timeout, defaultCreateNewTimeout, ReasonCreateTimeout)
	if err != nil {
		return nil, err
	}
	auth := "sprite"
	if p.cfg.publicURLs() {
		auth = "public"
	}
	body, _ := json.Marshal(map[string]any{"name": name, "wait_for_capacity": opts.WaitForCapacity,
		"url_settings": map[string]string{"auth": auth}})
	return bounded(ctx, timeout, ReasonCreateTimeout, ReasonCreateTransportFailed, func(ctx context.Context) (*sandbox.Handle, error) {
		resp, err := p.once(ctx, http.MethodPost, "/v1/sprites", body)
		if err != nil {
			return nil, transportOr(ctx, ReasonCreateTimeout, ReasonCreateTransportFailed)
		}
		switch {
		case resp.StatusCode == http.StatusConflict:
			resp.Body.Close()
			return nil, sandbox.ErrAlreadyExists
		case !is2xx(resp.StatusCode):
			resp.Body.Close()
			return nil, sandbox.FromHTTPStatus(resp.StatusCode, "", 0)
		}
		b, over, err := readCapped(resp.Body, boundedBodyCap)
		if err != nil {
			return nil, transportOr(ctx, ReasonCreateTimeout, ReasonCreateTransportFailed)
		}
		id, ok := createdID(b, over, name)
		if !ok {
			return nil, unavailable(ReasonCreateUnconfirmed)
		}
		h := sandbox.BuildHandle(ProviderName, name)
		h.InstanceID = id
		return h, nil
	})
}

func transportOr(ctx context.Context, timeoutReason, transportReason string) error {
	if ctx.Err() != nil {
		return unavailable(timeoutReason)
	}
	return unavailable(transportReason)
}

// createdID checks a create_new 2xx body: a JSON object whose name is the
// requested one and whose id is a string of 1–256 bytes.
func createdID(b []byte, over bool, name string) (string, bool) {
	if over {
		return "", false
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return "", false
	}
	n, _ := m["name"].(string)
	id, ok := m["id"].(string)
	if n != name || !ok || len(id) < 1 || len(id) > 256 {
		return "", false
	}
	return id, true
}

// DestroyOnce is one bounded deletion whose success needs provider-
// confirmed absence (spec §6.1.8): DELETE; a 404 is nil after one request;
// a 2xx is followed by exactly one GET, which must be 404; every other
// outcome — 401, 429 and 503 included — is Unavailable{delete_unconfirmed},
// never retried. Timeout defaults to 30 s (1 ms–120 s) and covers both
// requests; each body is capped at 64 KiB.
func (p *Provider) DestroyOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.DestroyOnceOptions) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	timeout, err := checkBoundedTimeout(opts.Timeout, defaultDestroyOnceTime, ReasonDeleteTimeout)
	if err != nil {
		return err
	}
	path := p.spritePath(h.Name)
	_, err = bounded(ctx, timeout, ReasonDeleteTimeout, ReasonDeleteTransportFailed, func(ctx context.Context) (struct{}, error) {
		unconfirmed := func() (struct{}, error) {
			return struct{}{}, transportOr(ctx, ReasonDeleteTimeout, ReasonDeleteUnconfirmed)
		}
		resp, err := p.once(ctx, http.MethodDelete, path, nil)
		if err != nil {
			return unconfirmed()
		}
		_, over, rerr := readCapped(resp.Body, boundedBodyCap)
		switch {
		case resp.StatusCode == http.StatusNotFound:
			if over || rerr != nil {
				return unconfirmed()
			}
			return struct{}{}, nil
		case !is2xx(resp.StatusCode):
			return unconfirmed()
		}
		// An accepted DELETE proves nothing yet: one GET must find it gone.
		resp, err = p.once(ctx, http.MethodGet, path, nil)
		if err != nil {
			return unconfirmed()
		}
		_, over, rerr = readCapped(resp.Body, boundedBodyCap)
		if resp.StatusCode == http.StatusNotFound && !over && rerr == nil {
			return struct{}{}, nil
		}
		return unconfirmed()
	})
	return err
}

// TerminateSession stops one session and keeps the sprite (spec §6.1.10):
// one POST …/exec/{id}/kill with signal SIGTERM (graceful) or SIGKILL
// (force) and the stop allowance, bounded by the allowance plus 5 s and a
// 16 KiB body. nil needs Sprites' confirmation: a 200 NDJSON stream
// ending in complete with an exit code, preceded only by signal, timeout,
// exited or killed events and including exited or killed (force also needs
// a SIGKILL signal event with a positive pid), or, in graceful mode only, a
// 404. Anything else is Unavailable{termination_unconfirmed}; other
// statuses go through the §3.2 table with no body.
func (p *Provider) TerminateSession(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.TerminateOptions) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	opts, err := sandbox.ValidateTermination(sessionID, opts)
	if err != nil {
		return err
	}
	signal := "SIGTERM"
	if opts.Mode == sandbox.Force {
		signal = "SIGKILL"
	}
	q := url.Values{"signal": {signal}, "timeout": {strconv.FormatInt(opts.Timeout.Milliseconds(), 10) + "ms"}}
	path := p.spritePath(h.Name, "exec", escapeSegment(sessionID), "kill") + "?" + q.Encode()
	_, err = bounded(ctx, opts.Timeout+terminationGrace, ReasonTerminationTimeout, ReasonTerminationTransport,
		func(ctx context.Context) (struct{}, error) {
			resp, err := p.once(ctx, http.MethodPost, path, nil)
			if err != nil {
				return struct{}{}, transportOr(ctx, ReasonTerminationTimeout, ReasonTerminationTransport)
			}
			switch {
			case resp.StatusCode == http.StatusNotFound:
				resp.Body.Close()
				if opts.Mode == sandbox.Force {
					// A missing parent does not prove its descendants gone.
					return struct{}{}, unavailable(ReasonTerminationUnconfirmed)
				}
				return struct{}{}, nil
			case resp.StatusCode != http.StatusOK:
				resp.Body.Close()
				return struct{}{}, sandbox.FromHTTPStatus(resp.StatusCode, "", 0)
			}
			b, over, err := readCapped(resp.Body, terminationBodyCap)
			if err != nil {
				return struct{}{}, transportOr(ctx, ReasonTerminationTimeout, ReasonTerminationTransport)
			}
			if over || !terminationConfirmed(b, opts.Mode == sandbox.Force) {
				return struct{}{}, unavailable(ReasonTerminationUnconfirmed)
			}
			return struct{}{}, nil
		})
	return err
}

// ndjsonObjects splits b into non-empty lines, each of which must be a
// JSON object (numbers kept exact).
func ndjsonObjects(b []byte) ([]map[string]any, bool) {
	var out []map[string]any
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil || m == nil || d.More() {
			return nil, false
		}
		out = append(out, m)
	}
	return out, true
}

// jsonInt reports v as an integer when it is a JSON number written as one
// (so 1.5, 1e2 and "137" are not).
func jsonInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	return i, err == nil
}

func terminationConfirmed(b []byte, force bool) bool {
	evs, ok := ndjsonObjects(b)
	if !ok || len(evs) < 2 {
		return false
	}
	last := evs[len(evs)-1]
	if last["type"] != "complete" {
		return false
	}
	if code, ok := jsonInt(last["exit_code"]); !ok || code < 0 || code > 255 {
		return false
	}
	ended, sigkill := false, false
	for _, ev := range evs[:len(evs)-1] {
		switch ev["type"] {
		case "exited", "killed":
			ended = true
		case "signal":
			if pid, ok := jsonInt(ev["pid"]); ok && pid > 0 && ev["signal"] == "SIGKILL" {
				sigkill = true
			}
		case "timeout":
		default:
			return false
		}
	}
	return ended && (!force || sigkill)
}

// validOperationID reports whether id matches ^[A-Za-z0-9_-]{1,128}$. It is
// a loop rather than a package-level regexp: the counted repetition compiles
// to a large program (about 1700 allocations at every process start, in the
// CLI too) for a check this small.
func validOperationID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CreateCheckpointOnce is the bounded checkpoint creation keyed by a host
// operation id (spec §6.1.12). Options are checked first (timeout 1 ms–
// 120 s, default 30 s; operation id ^[A-Za-z0-9_-]{1,128}$), then the
// flag (ErrNotSupported when off). One POST …/checkpoint with the comment
// "sandbox-operation:<id>" must answer exactly 200 with a complete NDJSON
// stream; then one GET …/checkpoints must answer exactly 200 with an array
// holding exactly one checkpoint of that comment (not "Current"). Both
// requests share one deadline and one 64 KiB budget. Every other outcome
// is Unavailable{checkpoint_unconfirmed}; never retried.
func (p *Provider) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOnceOptions) (string, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return "", err
	}
	timeout, err := checkBoundedTimeout(opts.Timeout, defaultCheckpointTimeout, ReasonCheckpointTimeout)
	if err != nil {
		return "", err
	}
	if !validOperationID(opts.OperationID) {
		return "", sandbox.Invalid(ReasonCheckpointOperationID, "operation id must match ^[A-Za-z0-9_-]{1,128}$")
	}
	if !p.cfg.CheckpointCreationEnabled {
		return "", sandbox.ErrNotSupported
	}
	comment := "sandbox-operation:" + opts.OperationID
	body, _ := json.Marshal(map[string]string{"comment": comment})
	return bounded(ctx, timeout, ReasonCheckpointTimeout, ReasonCheckpointTransport, func(ctx context.Context) (string, error) {
		unconfirmed := func() (string, error) {
			return "", transportOr(ctx, ReasonCheckpointTimeout, ReasonCheckpointUnconfirmed)
		}
		budget := int64(boundedBodyCap)
		resp, err := p.once(ctx, http.MethodPost, p.spritePath(h.Name, "checkpoint"), body)
		if err != nil {
			return unconfirmed()
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return unconfirmed()
		}
		b, over, err := readCapped(resp.Body, budget)
		if err != nil || over || !checkpointStreamComplete(b) {
			// A truncated body (fewer bytes than Content-Length) is a read
			// error here: a complete event inside it is not completion.
			return unconfirmed()
		}
		budget -= int64(len(b))
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= 0 {
			return "", unavailable(ReasonCheckpointTransport)
		}
		resp, err = p.once(ctx, http.MethodGet, p.spritePath(h.Name, "checkpoints"), nil)
		if err != nil {
			return unconfirmed()
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return unconfirmed()
		}
		b, over, err = readCapped(resp.Body, budget)
		if err != nil || over {
			return unconfirmed()
		}
		id, ok := uniqueCheckpoint(b, comment)
		if !ok {
			return unconfirmed()
		}
		return id, nil
	})
}

// checkpointStreamComplete applies the completeness grammar: info lines
// (data a string, no error key) while pending, then one complete line
// (same shape), then nothing.
func checkpointStreamComplete(b []byte) bool {
	evs, ok := ndjsonObjects(b)
	if !ok {
		return false
	}
	complete := false
	for _, ev := range evs {
		if complete {
			return false
		}
		if _, has := ev["error"]; has {
			return false
		}
		if _, isStr := ev["data"].(string); !isStr {
			return false
		}
		switch ev["type"] {
		case "info":
		case "complete":
			complete = true
		default:
			return false
		}
	}
	return complete
}

// uniqueCheckpoint checks the listing: an array of objects, each with an id
// of 1–256 bytes and a comment absent, null or a string; exactly one of
// them, not "Current", carries comment.
func uniqueCheckpoint(b []byte, comment string) (string, bool) {
	var arr []json.RawMessage
	if json.Unmarshal(b, &arr) != nil || arr == nil {
		return "", false
	}
	found := ""
	matches := 0
	for _, raw := range arr {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil || m == nil {
			return "", false
		}
		id, ok := m["id"].(string)
		if !ok || len(id) < 1 || len(id) > 256 {
			return "", false
		}
		var c string
		switch v := m["comment"].(type) {
		case nil:
		case string:
			c = v
		default:
			return "", false
		}
		if _, present := m["comment"]; present && c == comment && id != "Current" {
			matches++
			found = id
		}
	}
	if matches != 1 {
		return "", false
	}
	return found, true
}
