package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// cutter is a TCP proxy to target whose connections the test cuts.
type cutter struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cuts  int
	wg    sync.WaitGroup
}

func newCutter(t *testing.T, target string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			c.wg.Add(2)
			go func() { defer c.wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { defer c.wg.Done(); _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		c.cut()
		c.wg.Wait()
	})
	return c
}

// cut closes every connection open through the proxy.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.conns {
		_ = k.Close()
	}
	c.conns = nil
	c.cuts++
}

// TestStreamSurvivesDroppedSockets: a detachable spawn through the Go
// client, and an attach at an offset, whose sockets are cut (the TCP
// connections under them closed) three times mid-stream deliver the
// session's stdout and stderr each exactly once, in order, and its exit
// code: the client dials again and attaches at the bytes it delivered,
// which the platform skips. Fails on the old code: the first cut ended the
// command Unavailable{closed_before_exit} with the output cut short.
func TestStreamSurvivesDroppedSockets(t *testing.T) {
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}})
	u, _ := url.Parse(pl.URL)
	px := newCutter(t, u.Host)
	c := newClient(t, "http://"+px.ln.Addr().String(), pl.Account(t, "alice"), "local")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := c.Create(ctx, "resume", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	var wantOut, wantErr strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	script := fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo out $i; echo err $i >&2; i=$((i+1)); [ $((i %% 20)) = 0 ] && sleep 0.01; done; exit 7`, n)
	cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Stop()
	read := func(cmd *sandbox.Command, cutAt ...int) (string, string, sandbox.Event) {
		var out, errb bytes.Buffer
		for ev := range cmd.Events() {
			switch ev.Kind {
			case sandbox.Stdout:
				out.Write(ev.Data)
			case sandbox.Stderr:
				errb.Write(ev.Data)
			}
			if ev.Terminal() {
				return out.String(), errb.String(), ev
			}
			if len(cutAt) > 0 && out.Len() >= cutAt[0] {
				px.cut()
				cutAt = cutAt[1:]
			}
		}
		return out.String(), errb.String(), sandbox.Event{Kind: sandbox.Error, Err: fmt.Errorf("events closed without a terminal event")}
	}
	out, errs, end := read(cmd, 100, 1500, 3000)
	if out != wantOut.String() || errs != wantErr.String() || end.Kind != sandbox.Exit || end.Code != 7 {
		t.Fatalf("after %d cuts: stdout %d bytes (want %d), stderr %d (want %d), end %+v\nstdout tail %q",
			px.cuts, len(out), wantOut.Len(), len(errs), wantErr.Len(), end, out[max(0, len(out)-200):])
	}
	if px.cuts != 3 {
		t.Fatalf("%d cuts, want 3", px.cuts)
	}
	// An attach at an offset gets the rest, and survives a cut too.
	all := len(out) + len(errs)
	at, err := c.AttachAt(ctx, h, cmd.SessionID, int64(all-2000), sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer at.Stop()
	o2, e2, end2 := read(at, 200)
	if len(o2)+len(e2) != 2000 || !strings.HasSuffix(out, o2) || !strings.HasSuffix(errs, e2) || end2.Kind != sandbox.Exit || end2.Code != 7 {
		t.Fatalf("attach at %d: %d+%d bytes, want 2000 in all, end %+v", all-2000, len(o2), len(e2), end2)
	}
}
