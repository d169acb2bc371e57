package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// Files outside the home. The provider reaches the home through the
// host's directory behind it; the rest of the sandbox's tree (/tmp, a
// tmpfs in the sandbox's own mount namespace; the image's /etc, /opt)
// the host does not see as the sandbox does. A ReadFile, OpenFile,
// WriteFile or WriteFileFrom of an absolute path outside the home
// therefore runs a shell in the sandbox, as its user, that cats the file
// out or in: the same way `managoat cp` reaches those paths (a tar in the
// sandbox), so the files API and cp agree on what they can reach.
//
// Nothing here gives the sandbox more than it has: the command runs with
// the sandbox's own ids, namespaces and policy, so a symlink or a mount
// it planted leads only where it could go itself. What it sends back is
// hostile: the size line is bounded and parsed strictly, the reader
// yields at most that many bytes (and at most MaxReadFile for ReadFile),
// and its stderr is kept to one bounded line for the error.

// outsideHome reports the cleaned absolute path of name when name is an
// absolute path outside the home (the files the sandbox's own commands
// serve); false for anything else (relative, under the home, NUL).
func outsideHome(name string) (string, bool) {
	if name == "" || strings.ContainsRune(name, 0) || !path.IsAbs(name) {
		return "", false
	}
	clean := path.Clean(name)
	if clean == mechanism.Home || strings.HasPrefix(clean, mechanism.Home+"/") {
		return "", false
	}
	return clean, true
}

// The shell scripts' exit codes that mean something to the caller.
const (
	exitNotFound   = 66 // no such file
	exitNotRegular = 65 // a directory, a fifo, a device
)

// readScript prints the file's size on a line, then the file. A symlink
// is followed in the sandbox's view ([ -f ] and cat follow it), which is
// the sandbox's to choose.
const readScript = `p=$1
[ -e "$p" ] || exit 66
[ -f "$p" ] || exit 65
s=$(wc -c < "$p") || exit 1
printf '%s\n' $s
exec cat -- "$p"`

// A write is two commands: writeScript copies stdin to a new file beside
// the target; only once the caller's source ended without an error does
// renameScript put it over the target (a reader sees the old data or the
// new, never half). A source that fails midway leaves the target as it
// was: the first command is stopped and its file removed, never renamed.
const writeScript = `p=$1 t=$2
[ -d "$p" ] && exit 65
[ -e "$p" ] && [ ! -f "$p" ] && exit 65
mkdir -p -- "$(dirname -- "$p")" || exit 1
umask 077
exec cat > "$t"`

const renameScript = `t=$1 p=$2 m=$3
if [ -d "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then rm -f -- "$t"; exit 65; fi
chmod "$m" -- "$t" && mv -f -- "$t" "$p" && exit 0
rm -f -- "$t"
exit 1`

const removeScript = `rm -f -- "$1"`

// maxSizeLine bounds the size line readScript prints (digits and a
// newline: a size of up to 19 digits).
const maxSizeLine = 24

// maxErrLine bounds the stderr kept for an error.
const maxErrLine = 512

// spawnFileCmd starts script in the sandbox with args.
func (p *Provider) spawnFileCmd(ctx context.Context, h *sandbox.Handle, script string, stdin bool, args ...string) (*sandbox.Command, error) {
	return p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: append([]string{"-c", script, "sh"}, args...)}, sandbox.SpawnOptions{Stdin: stdin})
}

// fileCmdErr maps the script's exit code and stderr to the files API's
// errors.
func fileCmdErr(name string, code int, stderr []byte) error {
	switch code {
	case 0:
		return nil
	case exitNotFound:
		return sandbox.ErrNotFound
	case exitNotRegular:
		return sandbox.Invalid("path", name+" is not a regular file")
	}
	msg := strings.TrimSpace(string(stderr))
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	msg = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, msg)
	if msg == "" {
		msg = fmt.Sprintf("exit %d", code)
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "file", Err: fmt.Errorf("%s in the sandbox: %s", name, msg)}
}

// boundedBuf keeps the first max bytes written to it.
type boundedBuf struct {
	bytes.Buffer
	max int
}

func (b *boundedBuf) add(p []byte) {
	if room := b.max - b.Len(); room > 0 {
		if len(p) > room {
			p = p[:room]
		}
		b.Write(p)
	}
}

// openInSandbox is OpenFile for a path outside the home.
func (p *Provider) openInSandbox(ctx context.Context, h *sandbox.Handle, name string) (io.ReadCloser, int64, error) {
	c, err := p.spawnFileCmd(ctx, h, readScript, false, name)
	if err != nil {
		return nil, 0, err
	}
	r := &sandboxFile{c: c, name: name, stderr: boundedBuf{max: maxErrLine}}
	// The size line comes first (or the exit that refuses).
	var line []byte
	for {
		i := bytes.IndexByte(r.pending, '\n')
		if i >= 0 && i <= maxSizeLine {
			line = r.pending[:i]
			r.pending = r.pending[i+1:]
			break
		}
		if i > maxSizeLine || len(r.pending) > maxSizeLine {
			r.Close()
			return nil, 0, &sandbox.ProviderError{Provider: Name, Reason: "file", Err: fmt.Errorf("%s: the sandbox sent no size line", name)}
		}
		if err := r.next(ctx); err != nil {
			r.Close()
			return nil, 0, err
		}
	}
	size, err := strconv.ParseInt(string(line), 10, 64)
	if err != nil || size < 0 {
		r.Close()
		return nil, 0, &sandbox.ProviderError{Provider: Name, Reason: "file", Err: fmt.Errorf("%s: the sandbox sent a size of %q", name, line)}
	}
	r.left = size
	r.ctx = ctx
	return r, size, nil
}

// sandboxFile reads a file a command in the sandbox cats out: at most
// left bytes, then the command's exit.
type sandboxFile struct {
	c       *sandbox.Command
	ctx     context.Context
	name    string
	pending []byte
	left    int64
	stderr  boundedBuf
	exited  bool
	err     error
}

// next takes the command's next event: stdout into pending, stderr into
// the bounded buffer; the exit ends it (an io.EOF once the exit is 0).
func (r *sandboxFile) next(ctx context.Context) error {
	if r.err != nil {
		return r.err
	}
	select {
	case ev, ok := <-r.c.Events():
		switch {
		case !ok:
			r.err = sandbox.ClosedBeforeExit()
		case ev.Kind == sandbox.Stdout:
			r.pending = append(r.pending, ev.Data...)
		case ev.Kind == sandbox.Stderr:
			r.stderr.add(ev.Data)
		case ev.Kind == sandbox.Exit:
			r.exited = true
			if r.err = fileCmdErr(r.name, ev.Code, r.stderr.Bytes()); r.err == nil {
				r.err = io.EOF
			}
		case ev.Kind == sandbox.Error:
			r.err = ev.Err
		}
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	if r.err != nil && !errors.Is(r.err, io.EOF) {
		return r.err
	}
	return nil
}

func (r *sandboxFile) Read(b []byte) (int, error) {
	for {
		if r.left <= 0 {
			return 0, io.EOF
		}
		if len(r.pending) > 0 {
			n := copy(b, r.pending[:min(int64(len(r.pending)), r.left)])
			r.pending = r.pending[n:]
			r.left -= int64(n)
			return n, nil
		}
		if err := r.next(r.ctx); err != nil {
			return 0, err
		}
		if errors.Is(r.err, io.EOF) && len(r.pending) == 0 {
			// The command ended before the size it announced.
			return 0, io.ErrUnexpectedEOF
		}
	}
}

// Close stops the command's stream: a reader that stops early leaves no
// cat running behind it (its stdout closes, and it ends).
func (r *sandboxFile) Close() error {
	_ = r.c.Stop()
	return nil
}

// writeInSandbox is WriteFileFrom for a path outside the home.
func (p *Provider) writeInSandbox(ctx context.Context, h *sandbox.Handle, name string, src io.Reader, opts sandbox.WriteFileOptions) error {
	mode := opts.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	tmp := path.Join(path.Dir(name), ".managoat-write-"+newID())
	c, err := p.spawnFileCmd(ctx, h, writeScript, true, name, tmp)
	if err != nil {
		return err
	}
	var srcErr error
	buf := make([]byte, streamBuf)
	var werr error
	for werr == nil {
		n, err := readerOnly{ctx, src, &srcErr}.Read(buf)
		if n > 0 {
			werr = c.WriteStdin(ctx, buf[:n])
		}
		if err != nil {
			break
		}
	}
	if werr != nil && srcErr == nil && errors.Is(werr, sandbox.ErrCommandExited) {
		// The command refused before it read all (a directory at the
		// path): its exit says why.
		if err := waitFileCmd(ctx, c, name); err != nil {
			return err
		}
	}
	if srcErr != nil || werr != nil {
		_ = c.Stop()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = p.runFileCmd(cctx, h, tmp, removeScript, tmp)
		if srcErr != nil {
			return srcErr
		}
		return werr
	}
	if err := c.CloseStdin(ctx); err != nil {
		_ = c.Stop()
		return err
	}
	if err := waitFileCmd(ctx, c, name); err != nil {
		return err
	}
	return p.runFileCmd(ctx, h, name, renameScript, tmp, name, strconv.FormatUint(uint64(mode), 8))
}

// cleanupTimeout bounds the removal of a half-written file.
const cleanupTimeout = 10 * time.Second

// runFileCmd runs script in the sandbox with args and no stdin, and
// returns its exit as the files API's error.
func (p *Provider) runFileCmd(ctx context.Context, h *sandbox.Handle, name, script string, args ...string) error {
	c, err := p.spawnFileCmd(ctx, h, script, false, args...)
	if err != nil {
		return err
	}
	return waitFileCmd(ctx, c, name)
}

// waitFileCmd waits for c's exit, dropping its stdout and keeping a
// bounded line of its stderr.
func waitFileCmd(ctx context.Context, c *sandbox.Command, name string) error {
	defer c.Stop()
	stderr := boundedBuf{max: maxErrLine}
	for {
		select {
		case ev, ok := <-c.Events():
			switch {
			case !ok:
				return sandbox.ClosedBeforeExit()
			case ev.Kind == sandbox.Stderr:
				stderr.add(ev.Data)
			case ev.Kind == sandbox.Exit:
				return fileCmdErr(name, ev.Code, stderr.Bytes())
			case ev.Kind == sandbox.Error:
				return ev.Err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
