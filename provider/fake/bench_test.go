package fake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkSpawnFirstEvent measures spawn to the first event through the
// fake, and reports it as a ratio against starting a goroutine that sends
// one value on a plain channel, measured in the same run.
func BenchmarkSpawnFirstEvent(b *testing.B) {
	p := fake.New()
	defer p.Close()
	ctx := context.Background()
	h, _ := p.Create(ctx, "bench", sandbox.CreateOptions{})
	script := sandbox.Cmd{Name: "emit", Args: []string{"out:x"}}
	baseline := measure(b.N, func() {
		ch := make(chan []byte)
		go func() { ch <- []byte("x") }()
		<-ch
	})
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		c, err := p.Spawn(ctx, h, script, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		<-c.Events()
		for range c.Events() {
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per.Nanoseconds()), "ns/first-event")
	b.ReportMetric(float64(per)/float64(baseline), "x-plain-channel")
}

// BenchmarkEventThroughput streams 16 MiB of 32 KiB stdout chunks through
// the fake and reports MB/s and the ratio against the same chunks over a
// plain channel in the same run.
func BenchmarkEventThroughput(b *testing.B) {
	const chunk, chunks = 32 << 10, 512
	p := fake.New()
	defer p.Close()
	ctx := context.Background()
	h, _ := p.Create(ctx, "bench", sandbox.CreateOptions{})
	args := make([]string, chunks)
	data := strings.Repeat("x", chunk)
	for i := range args {
		args[i] = "out:" + data
	}
	script := sandbox.Cmd{Name: "emit", Args: args}
	total := float64(chunk * chunks)
	baseline := measure(max(b.N, 3), func() {
		ch := make(chan []byte, 1)
		go func() {
			for range chunks {
				ch <- []byte(data)
			}
			close(ch)
		}()
		for range ch {
		}
	})
	b.SetBytes(int64(total))
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		// A fresh sandbox each round, so journals of earlier rounds are freed.
		_ = p.Destroy(ctx, h)
		h, _ = p.Create(ctx, "bench", sandbox.CreateOptions{})
		c, err := p.Spawn(ctx, h, script, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ev := range c.Events() {
			n += len(ev.Data)
		}
		if n != chunk*chunks {
			b.Fatalf("got %d bytes", n)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(total/per.Seconds()/1e6, "MB/s")
	b.ReportMetric(float64(baseline)/float64(per), "of-plain-channel")
}

func measure(n int, f func()) time.Duration {
	n = max(n, 100)
	start := time.Now()
	for range n {
		f()
	}
	return time.Since(start) / time.Duration(n)
}
