package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"hash/crc32"
	"strconv"
	"testing"
	"time"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
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

// TestResumeChecksTheReplay: a resumed Command drops the replay's bytes
// it had delivered only when they are those bytes (their checksum): a
// daemon whose replay differs (its journal dropped output the reader had
// not read) ends the Command with unavailable replay_mismatch after the
// bytes it had, never with misplaced ones; a faithful replay goes on to
// the live output and the exit. A hand-driven daemon plays both.
func TestResumeChecksTheReplay(t *testing.T) {
	for _, faithful := range []bool{true, false} {
		t.Run(map[bool]string{true: "Faithful", false: "Differs"}[faithful], func(t *testing.T) {
			pl := newPlatform(t, prov.ServerConfig{})
			rd := dialRawCaps(t, pl, "replay", "")
			_, h := rawName(t, pl.online(t))
			p := pl.srv.Provider()
			c := spawnOnRaw(t, p, rd, h)
			chunk := bytes.Repeat([]byte("a"), 32<<10)
			frame := func(data []byte, replayFor int64) string {
				return string(wire.AppendStream(nil, &wire.Stream{Kind: wire.StreamStdout, SessionID: "s1", Data: data, ReplayFor: replayFor}))
			}
			// Well over half a Stream's bound, unread (all but what the
			// sockets' buffers hold is taken before the sends return):
			// the Command is behind and stops taking frames.
			const frames = (3 * sandbox.StreamLimit / 4) / (32 << 10)
			for range frames {
				rd.send(frame(chunk, 0))
			}
			// The reader drains; the Command attaches again.
			got := 0
			for got < 3*sandbox.StreamLimit/8 { // of the half it took: room for a quarter
				ev := recv(t, c, 10*time.Second)
				if ev.Kind != sandbox.Stdout {
					t.Fatalf("event %v after %d bytes", ev.Kind, got)
				}
				got += len(ev.Data)
			}
			req := rd.next()
			for req.Op == wire.OpDetach {
				req = rd.next()
			}
			if req.Op != wire.OpAttach || req.SessionID != "s1" {
				t.Fatalf("request %+v, want an attach of s1", req)
			}
			rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s1"}}`, req.ID))
			replay := chunk
			if !faithful {
				replay = bytes.Repeat([]byte("b"), 32<<10)
			}
			for range frames {
				rd.send(frame(replay, req.ID))
			}
			rd.send(frame([]byte("live"), 0))
			rd.send(`{"stream":"exit","session_id":"s1","exit_code":0}`)
			var tail []byte
			for {
				ev := recv(t, c, 10*time.Second)
				switch ev.Kind {
				case sandbox.Stdout:
					got += len(ev.Data)
					tail = append(tail[max(0, len(tail)-8):], ev.Data...)
					if !faithful && bytes.Contains(ev.Data, []byte("b")) {
						t.Fatal("a replay that differs was delivered")
					}
					continue
				case sandbox.Exit:
					if !faithful || got != frames*(32<<10)+4 || !bytes.HasSuffix(tail, []byte("alive")) {
						t.Fatalf("exit after %d bytes (want %d) ending %q", got, frames*(32<<10)+4, tail)
					}
				case sandbox.Error:
					var una *sandbox.UnavailableError
					if faithful || !errors.As(ev.Err, &una) || una.Reason != "replay_mismatch" {
						t.Fatalf("error %v after %d bytes", ev.Err, got)
					}
				}
				return
			}
		})
	}
}

// TestResumeAttachesAtOffset: to a daemon that reports attach_offset
// the resume's attach carries the offset its reader reached and the
// CRC-32C of the bytes before it, and the daemon's output from that
// offset on (none of the bytes before it) completes the stream exactly.
// (TestResumeChecksTheReplay is the other path: a daemon without the
// capability gets no offset and replays from byte zero.)
func TestResumeAttachesAtOffset(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd := dialRawCaps(t, pl, "offset", wire.CapAttachOffset)
	_, h := rawName(t, pl.online(t))
	c := spawnOnRaw(t, pl.srv.Provider(), rd, h)
	chunk := bytes.Repeat([]byte("a"), 32<<10)
	frame := func(data []byte, replayFor int64) string {
		return string(wire.AppendStream(nil, &wire.Stream{Kind: wire.StreamStdout, SessionID: "s1", Data: data, ReplayFor: replayFor}))
	}
	const frames = (3 * sandbox.StreamLimit / 4) / (32 << 10)
	for range frames {
		rd.send(frame(chunk, 0))
	}
	got := 0
	for got < 3*sandbox.StreamLimit/8 {
		ev := recv(t, c, 10*time.Second)
		if ev.Kind != sandbox.Stdout {
			t.Fatalf("event %v after %d bytes", ev.Kind, got)
		}
		got += len(ev.Data)
	}
	req := rd.next()
	for req.Op == wire.OpDetach {
		req = rd.next()
	}
	if req.Op != wire.OpAttach || req.SessionID != "s1" || req.Offset == nil {
		t.Fatalf("request %+v, want an attach of s1 at an offset", req)
	}
	off := *req.Offset
	if off <= 0 || off >= frames*(32<<10) {
		t.Fatalf("offset %d of %d bytes sent", off, frames*(32<<10))
	}
	if want := crc32.Checksum(bytes.Repeat([]byte("a"), int(off)), crc32.MakeTable(crc32.Castagnoli)); req.OffsetCRC != want {
		t.Fatalf("offset_crc %d, want %d", req.OffsetCRC, want)
	}
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s1"}}`, req.ID))
	rest := bytes.Repeat([]byte("a"), frames*(32<<10)-int(off))
	for len(rest) > 0 {
		n := min(len(rest), 32<<10)
		rd.send(frame(rest[:n], req.ID))
		rest = rest[n:]
	}
	rd.send(frame([]byte("live"), 0))
	rd.send(`{"stream":"exit","session_id":"s1","exit_code":0}`)
	var tail []byte
	for {
		ev := recv(t, c, 10*time.Second)
		switch ev.Kind {
		case sandbox.Stdout:
			got += len(ev.Data)
			tail = append(tail[max(0, len(tail)-8):], ev.Data...)
			continue
		case sandbox.Exit:
			if got != frames*(32<<10)+4 || !bytes.HasSuffix(tail, []byte("alive")) {
				t.Fatalf("exit after %d bytes (want %d) ending %q", got, frames*(32<<10)+4, tail)
			}
		default:
			t.Fatalf("event %v after %d bytes", ev, got)
		}
		return
	}
}
