package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFromHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		status int
		kind   string
	}{
		{404, "not_found"}, {401, "denied"}, {403, "denied"}, {429, "rate_limited"},
		{500, "unavailable"}, {503, "unavailable"}, {599, "unavailable"},
		{400, "invalid"}, {418, "invalid"}, {422, "invalid"}, {302, "invalid"}, {200, "invalid"},
	} {
		err := sandbox.FromHTTPStatus(tc.status, "body", 0)
		if got := sandbox.Kind(err); got != tc.kind {
			t.Errorf("status %d: kind %q, want %q", tc.status, got, tc.kind)
		}
	}
	var rl *sandbox.RateLimitedError
	if err := sandbox.FromHTTPStatus(429, "", 7*time.Second); !errors.As(err, &rl) || rl.RetryAfter != 7*time.Second {
		t.Fatalf("429 = %v", err)
	}
}

func TestRetryAfterFromJSON(t *testing.T) {
	for v, want := range map[any]time.Duration{float64(3): 3 * time.Second, float64(-1): 0, float64(1.5): 0, "3": 0, nil: 0, float64(0): 0} {
		if got := sandbox.RetryAfterFromJSON(v); got != want {
			t.Errorf("RetryAfterFromJSON(%v) = %v, want %v", v, got, want)
		}
	}
}

func TestTransient(t *testing.T) {
	yes := []error{sandbox.Unavailable("x", nil), &sandbox.RateLimitedError{}, &sandbox.ProviderError{Provider: "p", Reason: "closed"},
		errors.New("unknown"), sandbox.ErrCommandExited, &sandbox.WriteFailedError{}, sandbox.ClosedBeforeExit(),
		fmt.Errorf("wrapped: %w", sandbox.ExecTimeout(time.Second))}
	no := []error{nil, sandbox.ErrNotFound, sandbox.ErrTruncated, sandbox.ErrNotSupported, sandbox.ErrAlreadyExists,
		&sandbox.DeniedError{}, &sandbox.InvalidError{}, &sandbox.RestoreFailedError{}, context.Canceled,
		fmt.Errorf("op: %w", sandbox.ErrNotFound)}
	for _, e := range yes {
		if !sandbox.Transient(e) {
			t.Errorf("Transient(%v) = false", e)
		}
	}
	for _, e := range no {
		if sandbox.Transient(e) {
			t.Errorf("Transient(%v) = true", e)
		}
	}
}

func TestRetry(t *testing.T) {
	ctx := context.Background()
	fast := sandbox.Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	calls := 0
	count := func(errs ...error) func(context.Context) error {
		calls = 0
		return func(context.Context) error {
			calls++
			if calls <= len(errs) {
				return errs[calls-1]
			}
			return nil
		}
	}
	timeout := sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	if err := sandbox.Retry(ctx, fast, count()); err != nil || calls != 1 {
		t.Fatalf("first-try success: %v after %d calls", err, calls)
	}
	if err := sandbox.Retry(ctx, fast, count(timeout)); err != nil || calls != 2 {
		t.Fatalf("one failure: %v after %d calls", err, calls)
	}
	if err := sandbox.Retry(ctx, fast, count(timeout, timeout, timeout, timeout, timeout)); err != timeout || calls != 3 {
		t.Fatalf("exhausted: %v after %d calls", err, calls)
	}
	if err := sandbox.Retry(ctx, fast, count(sandbox.ErrNotFound)); err != sandbox.ErrNotFound || calls != 1 {
		t.Fatalf("permanent: %v after %d calls", err, calls)
	}
	never := fast
	never.Retriable = func(error) bool { return false }
	if _ = sandbox.Retry(ctx, never, count(timeout)); calls != 1 {
		t.Fatalf("classifier ignored: %d calls", calls)
	}
	// A RateLimited retry-after raises the delay.
	if d := fast.Delay(1, &sandbox.RateLimitedError{RetryAfter: time.Second}); d != time.Second {
		t.Fatalf("Delay with retry-after = %v", d)
	}
	for n := 1; n < 40; n++ {
		d := sandbox.Backoff{}.Delay(n, nil)
		ceil := min(250*time.Millisecond<<min(n-1, 20), 2*time.Second)
		if d < ceil/2 || d > ceil {
			t.Fatalf("Delay(%d) = %v outside [%v, %v]", n, d, ceil/2, ceil)
		}
	}
	// A cancelled context stops the waiting.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	slow := sandbox.Backoff{Base: time.Hour, Max: time.Hour, Logger: slog.New(slog.DiscardHandler)}
	if err := sandbox.Retry(cctx, slow, count(timeout)); !errors.Is(err, context.Canceled) || !errors.Is(err, timeout) || calls != 1 {
		t.Fatalf("cancelled: %v after %d calls", err, calls)
	}
}

func TestHandleNeverPrintsPrivate(t *testing.T) {
	h := &sandbox.Handle{Provider: "sprites", Name: "box", InstanceID: "i-1", Private: map[string]string{"token": "SECRET"}}
	var buf bytes.Buffer
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		fmt.Fprintf(&buf, f+"\n", h)
	}
	fmt.Fprintf(&buf, "%+v\n", struct{ H *sandbox.Handle }{h})
	j, _ := json.Marshal(h)
	buf.Write(j)
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "h", h)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "h", h)
	if strings.Contains(buf.String(), "SECRET") {
		t.Fatalf("secret leaked:\n%s", buf.String())
	}
	if !strings.Contains(string(j), `"instance_id":"i-1"`) {
		t.Fatalf("JSON lacks the instance id: %s", j)
	}
	var back sandbox.Handle
	if err := json.Unmarshal(j, &back); err != nil || back.Name != "box" || back.Private != nil {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "conformance-12", "A.b_c-9", strings.Repeat("x", 63)} {
		if err := sandbox.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 64), "a/b", `a\b`, "a\x00", ".", "..", "-x", "a b", "é"} {
		var iv *sandbox.InvalidError
		if err := sandbox.ValidateName(bad); !errors.As(err, &iv) {
			t.Errorf("ValidateName(%q) = %v", bad, err)
		}
	}
}

func TestStreamRules(t *testing.T) {
	c, s := sandbox.NewCommand(nil, "r1", nil)
	s.Stdout([]byte("a"))
	s.Exit(3)
	if s.Stdout([]byte("late")) || s.Exit(0) || s.Fail(errors.New("x")) {
		t.Fatal("events accepted after the terminal event")
	}
	var got []sandbox.Event
	for ev := range c.Events() {
		got = append(got, ev)
	}
	if len(got) != 2 || string(got[0].Data) != "a" || got[1].Kind != sandbox.Exit || got[1].Code != 3 || got[1].Ref != "r1" {
		t.Fatalf("events %+v", got)
	}
	c2, s2 := sandbox.NewCommand(nil, "", nil)
	s2.Stdout([]byte("partial"))
	s2.Close()
	<-c2.Events()
	if ev := <-c2.Events(); ev.Kind != sandbox.Error || !sandbox.IsClosedBeforeExit(ev.Err) {
		t.Fatalf("close without exit = %+v", ev)
	}
	c3, s3 := sandbox.NewCommand(nil, "", nil)
	s3.Stdout([]byte("x"))
	_ = c3.Stop()
	_ = c3.Stop()
	if _, ok := <-c3.Events(); ok {
		// a queued event may already be in flight; the channel must close next
		if _, ok := <-c3.Events(); ok {
			t.Fatal("events after Stop")
		}
	}
}

func TestRegistryUnknownProvider(t *testing.T) {
	reg := sandbox.NewRegistry()
	_, err := reg.Get(context.Background(), sandbox.BuildHandle("modal", "x"))
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || !strings.Contains(err.Error(), `unknown sandbox provider "modal"`) {
		t.Fatalf("unknown provider = %v", err)
	}
	if _, err := reg.Get(context.Background(), nil); !errors.As(err, &iv) {
		t.Fatalf("nil handle = %v", err)
	}
}

func TestValidateTermination(t *testing.T) {
	o, err := sandbox.ValidateTermination("s-1", sandbox.TerminateOptions{})
	if err != nil || o.Mode != sandbox.Graceful || o.Timeout != 10*time.Second {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, tc := range []struct {
		id string
		o  sandbox.TerminateOptions
	}{{"", sandbox.TerminateOptions{}}, {"a/b", sandbox.TerminateOptions{}}, {"ok", sandbox.TerminateOptions{Mode: "x"}},
		{"ok", sandbox.TerminateOptions{Timeout: 31 * time.Second}}, {"ok", sandbox.TerminateOptions{Timeout: time.Microsecond}}} {
		if _, err := sandbox.ValidateTermination(tc.id, tc.o); err == nil {
			t.Errorf("ValidateTermination(%q, %+v) accepted", tc.id, tc.o)
		}
	}
}

// TestStreamWaitRoom: a producer that waits for room before each send
// never drops a slow reader, its queue stays within half the limit, and
// every byte arrives; a detach releases a waiting producer.
func TestStreamWaitRoom(t *testing.T) {
	c, s := sandbox.NewCommand(nil, "", nil)
	s.SetLimit(1000)
	const n = 50
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; i < n; i++ {
			if !s.WaitRoom(context.Background(), 300) {
				t.Error("WaitRoom refused a live stream")
				return
			}
			s.Stdout(make([]byte, 300))
		}
		s.Exit(0)
	}()
	got := 0
	for ev := range c.Events() {
		if ev.Kind == sandbox.Error {
			t.Fatalf("the reader was dropped: %v", ev.Err)
		}
		got += len(ev.Data)
		time.Sleep(time.Millisecond) // a slow reader
	}
	<-produced
	if got != n*300 {
		t.Fatalf("got %d bytes, want %d", got, n*300)
	}

	c2, s2 := sandbox.NewCommand(nil, "", nil)
	s2.SetLimit(1000)
	s2.Stdout(make([]byte, 400))
	s2.Stdout(make([]byte, 400)) // the reader takes nothing: no room for more
	released := make(chan bool)
	go func() { released <- s2.WaitRoom(context.Background(), 400) }()
	_ = c2.Stop()
	if <-released {
		t.Fatal("WaitRoom reported room on a detached stream")
	}
}

// TestStreamDropsASlowReader: output queued past the stream's limit drops
// the reader with Unavailable{slow_reader} and frees the queue; the
// producer learns it (its sends report false).
func TestStreamDropsASlowReader(t *testing.T) {
	c, s := sandbox.NewCommand(nil, "", nil)
	s.SetLimit(1000)
	if !s.Stdout(make([]byte, 600)) {
		t.Fatal("the first 600 bytes were refused")
	}
	for range 4 { // over the limit (the pump holds at most one event aside)
		s.Stdout(make([]byte, 600))
	}
	if s.Stdout([]byte("more")) {
		t.Fatal("output accepted after the reader was dropped")
	}
	var got []sandbox.Event
	for ev := range c.Events() {
		got = append(got, ev)
	}
	last := got[len(got)-1]
	if last.Kind != sandbox.Error || !strings.Contains(last.Err.Error(), sandbox.ReasonSlowReader) {
		t.Fatalf("events %+v, want the slow reader's error last", got)
	}
	for _, ev := range got[:len(got)-1] {
		if len(ev.Data) != 600 {
			t.Fatalf("events %+v", got)
		}
	}
}
