package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Backoff configures Retry. The zero value means 3 attempts, a 250 ms base,
// a 2 s ceiling and Transient as the classifier.
//
// Retry is only for idempotent calls (create, get, destroy, policy
// application, exec of an idempotent script). Never wrap a spawn, a stdin
// write or anything whose repetition would do the work twice.
type Backoff struct {
	Attempts  int           // total attempts; zero means 3
	Base      time.Duration // zero means 250 ms
	Max       time.Duration // zero means 2 s
	Label     string        // for the log line; zero means "external call"
	Retriable func(error) bool
	Logger    *slog.Logger // zero means slog.Default()
}

func (b Backoff) withDefaults() Backoff {
	if b.Attempts <= 0 {
		b.Attempts = 3
	}
	if b.Base <= 0 {
		b.Base = 250 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 2 * time.Second
	}
	if b.Label == "" {
		b.Label = "external call"
	}
	if b.Retriable == nil {
		b.Retriable = Transient
	}
	if b.Logger == nil {
		b.Logger = slog.Default()
	}
	return b
}

// Delay is the wait after failed attempt n (1-based): a random duration in
// [ceiling/2, ceiling] with ceiling = min(Base·2^(n-1), Max). A
// RateLimitedError's RetryAfter raises it (the Elixir library ignored the hint).
func (b Backoff) Delay(n int, err error) time.Duration {
	b = b.withDefaults()
	ceiling := b.Max
	if n-1 < 31 {
		if c := b.Base << (n - 1); c > 0 && c < b.Max {
			ceiling = c
		}
	}
	d := ceiling/2 + time.Duration(rand.Int64N(int64(ceiling/2)+1))
	var rl *RateLimitedError
	if errors.As(err, &rl) && rl.RetryAfter > d {
		d = rl.RetryAfter
	}
	return d
}

// Retry calls fn until it succeeds, returns an error the classifier calls
// permanent, or the attempts run out; it returns fn's last error unchanged.
// It waits between attempts as Delay says and stops early, returning the
// last error joined with ctx's, when ctx is done.
func Retry(ctx context.Context, b Backoff, fn func(ctx context.Context) error) error {
	_, err := RetryValue(ctx, b, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) })
	return err
}

// RetryValue is Retry for a function that returns a value.
func RetryValue[T any](ctx context.Context, b Backoff, fn func(ctx context.Context) (T, error)) (T, error) {
	b = b.withDefaults()
	for n := 1; ; n++ {
		v, err := fn(ctx)
		if err == nil || n >= b.Attempts || !b.Retriable(err) {
			return v, err
		}
		d := b.Delay(n, err)
		b.Logger.Warn("retry: "+b.Label, "attempt", n, "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}
