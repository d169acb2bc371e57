package e2bdoor

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/managoat/managoat/sandbox"
)

// filesystem.Filesystem/WatchDir (the SDK's files.watchDir) is served by
// polling: the platform has no file events, and a sandbox's image need not
// have inotify tools, so the door runs one find(1) loop in the sandbox
// (through /v1, as the sandbox's user) that prints a snapshot of the
// directory every watchEvery, and sends the differences between two
// snapshots as envd's events: a new name is CREATE, a gone name REMOVE (or
// RENAME when its inode shows up under a new name in the same snapshot,
// then CREATE for the new name, as inotify reports a move), a changed size
// or mtime WRITE, a changed mode CHMOD. A change undone within one interval
// is not seen; two writes within one are one WRITE.
//
// The loop's output is the sandbox's and read as hostile: records are
// NUL-separated (a name may hold any byte but NUL and '/'), a snapshot
// past watchMaxEntries entries or watchMaxBytes bytes ends the watch with
// resource_exhausted, and a malformed record ends it with internal: never
// an event made up from a partial snapshot.
const (
	watchEvery      = 200 * time.Millisecond
	watchMaxEntries = 10000
	watchMaxBytes   = 4 << 20
	watchKeepalive  = 30 * time.Second
)

// watchScript prints, every $3 seconds, one NUL-ended record per entry
// under $1 (to depth $2): type|inode|size|mtime|mode|relative name, then
// the record "E" that ends a snapshot. Exit 44: not a directory.
const watchScript = `[ -d "$1" ] || exit 44; cd -- "$1" || exit 1
while :; do
	find . -mindepth 1 -maxdepth "$2" -printf '%y|%i|%s|%T@|%m|%P\0' 2>/dev/null
	printf 'E\0'
	sleep "$3"
done`

type watchReq struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

type watchResp struct {
	Start      *empty   `json:"start,omitempty"`
	Filesystem *fsEvent `json:"filesystem,omitempty"`
	Keepalive  *empty   `json:"keepalive,omitempty"`
}

type fsEvent struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// watchEntry is what a snapshot knows of one name.
type watchEntry struct {
	kind, inode, size, mtime, mode string
}

func (d *Door) watchDir(ctx context.Context, req *connect.Request[watchReq], st *connect.ServerStream[watchResp]) error {
	c := callOf(ctx)
	if req.Msg.Path == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
	}
	depth := "1"
	if req.Msg.Recursive {
		depth = "64"
	}
	every := strconv.FormatFloat(watchEvery.Seconds(), 'f', -1, 64)
	cmd, err := c.p.Spawn(ctx, c.h, sandbox.Cmd{Name: "/bin/sh", Args: []string{"-c", watchScript, "sh", req.Msg.Path, depth, every}}, sandbox.SpawnOptions{})
	if err != nil {
		return rpcErr(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = c.p.SignalCommand(sctx, cmd, syscall.SIGKILL)
		cancel()
		_ = cmd.Stop()
	}()
	var (
		buf     []byte
		prev    map[string]watchEntry
		cur     = map[string]watchEntry{}
		started bool
		tick    = time.NewTicker(watchKeepalive)
	)
	defer tick.Stop()
	events := cmd.Events()
	for {
		select {
		case <-ctx.Done():
			if started {
				return nil // the watcher stopped (the SDK's stop aborts the stream)
			}
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		case <-d.done:
			return connect.NewError(connect.CodeUnavailable, errors.New("the door is closing"))
		case <-tick.C:
			if started {
				if err := st.Send(&watchResp{Keepalive: &empty{}}); err != nil {
					return err
				}
			}
			continue
		case ev, ok := <-events:
			if !ok {
				return connect.NewError(connect.CodeUnavailable, errors.New("the watch's command ended"))
			}
			switch ev.Kind {
			case sandbox.Stderr:
				continue
			case sandbox.Exit:
				if ev.Code == 44 {
					return connect.NewError(connect.CodeNotFound, errors.New("directory '"+req.Msg.Path+"' does not exist"))
				}
				return connect.NewError(connect.CodeUnavailable, errors.New("the watch's command ended: exit "+itoa(ev.Code)))
			case sandbox.Stdout:
			default:
				return rpcErr(ev.Err)
			}
			buf = append(buf, ev.Data...)
		}
		for {
			i := bytes.IndexByte(buf, 0)
			if i < 0 {
				if len(buf) > watchMaxBytes {
					return connect.NewError(connect.CodeResourceExhausted, errors.New("a snapshot record is over 4 MiB"))
				}
				break
			}
			rec := string(buf[:i])
			buf = buf[i+1:]
			if rec == "E" {
				if prev != nil {
					for _, e := range diffSnapshots(prev, cur) {
						if err := st.Send(&watchResp{Filesystem: &e}); err != nil {
							return err
						}
					}
				} else if err := st.Send(&watchResp{Start: &empty{}}); err != nil {
					return err
				} else {
					started = true
				}
				prev, cur = cur, make(map[string]watchEntry, len(cur))
				continue
			}
			f := strings.SplitN(rec, "|", 6)
			if len(f) != 6 || f[5] == "" {
				return connect.NewError(connect.CodeInternal, errors.New("malformed watch record"))
			}
			if len(cur) >= watchMaxEntries {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("the directory holds over "+itoa(watchMaxEntries)+" entries"))
			}
			cur[f[5]] = watchEntry{kind: f[0], inode: f[1], size: f[2], mtime: f[3], mode: f[4]}
		}
		if len(buf) > watchMaxBytes {
			return connect.NewError(connect.CodeResourceExhausted, errors.New("a snapshot record is over 4 MiB"))
		}
	}
}

// diffSnapshots returns the events that lead from a to b, removals and
// renames first, in name order within each kind.
func diffSnapshots(a, b map[string]watchEntry) []fsEvent {
	var gone, added, changed []string
	for n := range a {
		if _, ok := b[n]; !ok {
			gone = append(gone, n)
		}
	}
	for n, e := range b {
		o, ok := a[n]
		switch {
		case !ok || o.inode != e.inode || o.kind != e.kind:
			if ok { // replaced under the same name
				gone = append(gone, n)
			}
			added = append(added, n)
		case o.size != e.size || o.mtime != e.mtime || o.mode != e.mode:
			changed = append(changed, n)
		}
	}
	slices.Sort(gone)
	slices.Sort(added)
	slices.Sort(changed)
	newInode := map[string]bool{}
	for _, n := range added {
		newInode[b[n].inode] = true
	}
	var out []fsEvent
	for _, n := range gone {
		t := "EVENT_TYPE_REMOVE"
		if _, still := b[n]; !still && newInode[a[n].inode] {
			t = "EVENT_TYPE_RENAME"
		}
		out = append(out, fsEvent{Name: n, Type: t})
	}
	for _, n := range added {
		out = append(out, fsEvent{Name: n, Type: "EVENT_TYPE_CREATE"})
	}
	for _, n := range changed {
		o, e := a[n], b[n]
		if o.size != e.size || o.mtime != e.mtime {
			out = append(out, fsEvent{Name: n, Type: "EVENT_TYPE_WRITE"})
		}
		if o.mode != e.mode {
			out = append(out, fsEvent{Name: n, Type: "EVENT_TYPE_CHMOD"})
		}
	}
	return out
}
