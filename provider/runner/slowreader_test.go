package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strconv"
	"testing"
	"time"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
)

// TestSlowReaderResumesOverWire (issue 31, 1): a Command's reader that
// falls behind, twice (it reads nothing for a second at the start and
// again midway, while the session writes 75 MiB, more than a Stream
// queues), gets every byte in order and the exit: its subscription
// stops and resumes from the daemon's replay at the offset it reached,
// and the socket's other traffic is never held up (an exec answers
// meanwhile). On the platform's own provider and through the proxy
// (another process's runner Client). Before the fix the Command ended
// with unavailable slow_reader at 64 MiB.
func TestSlowReaderResumesOverWire(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	startDaemon(t, pl.ts.URL, newLocal(t, "trusted", t.TempDir()), nil)
	name := namer(pl.online(t))
	cl := prov.NewClient(pl.ts.URL, token)
	t.Cleanup(func() { _ = cl.Close() })
	var want bytes.Buffer
	const n = 10_000_000
	for i := 1; i <= n; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	wantSum := sha256.Sum256(want.Bytes())
	for _, tc := range []struct {
		name string
		p    *prov.Provider
	}{{"Platform", pl.srv.Provider()}, {"Proxy", prov.NewProvider(cl, prov.ProviderOptions{})}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			h, err := tc.p.Create(ctx, name(), sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cmd, err := tc.p.Spawn(ctx, h, sandbox.Cmd{Name: "seq", Args: []string{"1", strconv.Itoa(n)}}, sandbox.SpawnOptions{Detachable: true})
			if err != nil {
				t.Fatal(err)
			}
			defer cmd.Stop()
			time.Sleep(time.Second) // behind: nothing read
			if res, err := tc.p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"beside"}}, sandbox.ExecOptions{}); err != nil || string(res.Output) != "beside\n" {
				t.Fatalf("an exec on the same socket meanwhile: %q %v", res.Output, err)
			}
			sum := sha256.New()
			got, stalled := 0, false
			for ev := range cmd.Events() {
				switch ev.Kind {
				case sandbox.Stdout:
					sum.Write(ev.Data)
					got += len(ev.Data)
					if !stalled && got > want.Len()/2 {
						stalled = true
						time.Sleep(time.Second) // behind again
					}
				case sandbox.Exit:
					if ev.Code != 0 || got != want.Len() || [32]byte(sum.Sum(nil)) != wantSum {
						t.Fatalf("exit %d after %d bytes (want %d), sha256 match %v", ev.Code, got, want.Len(), [32]byte(sum.Sum(nil)) == wantSum)
					}
					return
				case sandbox.Error:
					t.Fatalf("after %d bytes: %v", got, ev.Err)
				}
			}
			t.Fatalf("events closed after %d bytes without an exit", got)
		})
	}
}
