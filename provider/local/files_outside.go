package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// Files outside the home. The provider reaches the home through the
// host's directory behind it, opened as a root confined to it (files.go).
// The rest of the sandbox's tree (/tmp, a tmpfs in the sandbox's own mount
// namespace; the image's /etc, /opt) the host does not see as the sandbox
// does, so an absolute path outside the home is reached from inside the
// sandbox: a small sh script started through the mechanism, in the
// sandbox's namespaces, as its user, with its policy — the way
// `managoat cp` reaches those paths (a tar in the sandbox). The files API
// and cp therefore agree on what they can reach, and nothing here can
// reach further than a command of the sandbox's own could.
//
// Only on a mechanism that isolates the sandbox's files: one that
// guarantees filesystem_confinement and privilege_separation (the jail,
// oci/runc, oci/runsc). Under the trusted mechanism a "command in the
// sandbox" is a command on this host as this host's user (root, often),
// so a WriteFile("/etc/passwd") would write the host's: there a path
// outside the home is refused (Invalid, naming why) and only the home,
// reached through its confined root, is served.
//
// What the sandbox sends back is hostile (its sh, wc and cat are its own
// to replace): the size line is bounded and parsed strictly, the reader
// yields at most the bytes announced (ReadFile at most MaxReadFile), a
// file shorter than announced is an error rather than a silent
// truncation, stderr is kept to one bounded line, and a reader blocked on
// a process that will not end is freed when the caller's context ends or
// the reader is closed. The commands go straight through the mechanism
// (mechanism.StartProcess), not the supervisor: they are no session, are
// not journaled and are not listed by `managoat sessions`.

// outsideHome reports the cleaned absolute path of name when name is an
// absolute path outside the home; false for anything else (relative,
// under the home, empty, NUL).
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

// isolatesFiles reports whether m keeps a sandbox's commands from the
// host's files: its own mount namespace and root, and an unprivileged
// user. Only then may a host-side operation be done by a command in the
// sandbox.
func isolatesFiles(m mechanism.Mechanism) bool {
	g := mechanism.Guaranteed(m)
	return m.Name() != "trusted" && slices.Contains(g, mechanism.FilesystemConfinement) && slices.Contains(g, mechanism.PrivilegeSeparation)
}

// outsideRefused is the error for a path outside the home on a mechanism
// that does not isolate the sandbox's files.
func outsideRefused(name string, m mechanism.Mechanism) error {
	return sandbox.Invalid("path", fmt.Sprintf("%s is outside %s, and mechanism %s does not isolate the sandbox's files "+
		"(its commands run on this host, as this host's user), so the files API reaches only the home there", name, mechanism.Home, m.Name()))
}

// The scripts' exit codes that mean something to the caller.
const (
	exitNotFound   = 66 // no such file
	exitNotRegular = 65 // a directory, a fifo, a device
	exitDenied     = 77 // the sandbox's user may not read the file, or write its directory
)

// readScript prints the file's size on a line, then the file. A symlink
// is followed in the sandbox's view ([ -f ] and cat follow it), which
// leads only where the sandbox's own commands go.
const readScript = `p=$1
[ -e "$p" ] || exit 66
[ -f "$p" ] || exit 65
[ -r "$p" ] || exit 77
s=$(wc -c < "$p") || exit 1
printf '%s\n' $s
exec cat -- "$p"`

// A write is two commands: writeScript copies stdin to a new file beside
// the target (noclobber: never through something already there); only
// once the caller's source ended without an error does renameScript put
// it over the target, so a reader sees the old data or the new, never
// half. A source that fails midway leaves the target as it was: the first
// command is killed and its file removed, never renamed.
const writeScript = `p=$1 t=$2
[ -d "$p" ] && exit 65
[ -e "$p" ] && [ ! -f "$p" ] && exit 65
d=$(dirname -- "$p")
mkdir -p -- "$d" || exit 1
[ -w "$d" ] || exit 77
umask 077
set -C
exec cat > "$t"`

const renameScript = `t=$1 p=$2 m=$3
if [ -d "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then rm -f -- "$t"; exit 65; fi
chmod "$m" -- "$t" && mv -f -- "$t" "$p" && exit 0
rm -f -- "$t"
exit 1`

const removeScript = `rm -f -- "$1"`

const (
	// maxSizeLine bounds the size line readScript prints: up to 19
	// digits and a newline.
	maxSizeLine = 20
	// maxErrLine bounds the stderr kept for an error.
	maxErrLine = 512
	// stepTimeout bounds a command that takes no stream (the rename, the
	// removal of a half-written file) and the wait for a killed one.
	stepTimeout = 30 * time.Second
)

// boundedBuf keeps the first max bytes written to it and drops the rest
// (a Write always succeeds, so a copy into it drains its source).
type boundedBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fileCmdErr maps a script's exit code and stderr to the files API's
// errors; the stderr is one line, its control characters replaced.
func fileCmdErr(name string, code int, stderr string) error {
	switch code {
	case 0:
		return nil
	case exitNotFound:
		return sandbox.ErrNotFound
	case exitNotRegular:
		return sandbox.Invalid("path", name+" is not a regular file")
	case exitDenied:
		return sandbox.Invalid("permission_denied", name+": the sandbox's user may not read it, or write where it goes (a path outside the home is reached as that user, as its commands reach it)")
	}
	return outsideErr(name, fmt.Errorf("exit %d: %s", code, errLine(stderr, "no message")))
}

func errLine(stderr, dflt string) string {
	msg := strings.TrimSpace(stderr)
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	msg = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return '?'
		}
		return r
	}, msg)
	if msg == "" {
		return dflt
	}
	return msg
}

func outsideErr(name string, err error) error {
	return &sandbox.ProviderError{Provider: Name, Reason: "file", Err: fmt.Errorf("%s in the sandbox: %w", name, err)}
}

// inSandbox is a script started in a sandbox through its mechanism, its
// stdin and stdout pipes this process's own; its stderr goes to a bounded
// buffer (the mechanism copies it there: oci filters its runtime's
// messages out of it).
type inSandbox struct {
	proc   mechanism.Process
	stdin  *os.File // nil unless asked for
	stdout *os.File // nil unless asked for
	errBuf boundedBuf

	stopOnce sync.Once
	waitOnce sync.Once
	waitDone chan struct{}
	exit     mechanism.ExitState
	waitErr  error
	release  func() bool // stops the context's AfterFunc
}

// startScript starts script (with args) in r's sandbox, as the sandbox's
// user, in /, with the sandbox's environment. The sandbox is started
// (or resumed) as a command would start it.
func (p *Provider) startScript(ctx context.Context, r *record, dir string, m mechanism.Mechanism, wantIn, wantOut bool, script string, args ...string) (*inSandbox, error) {
	argv, env := p.command(r, m, append([]string{"sh", "-c", script, "sh"}, args...), nil)
	direct := execDirect(r, dir)
	if !direct {
		if err := p.ensureRunning(ctx, r, dir); err != nil {
			return nil, err
		}
	}
	s, err := startPipes(ctx, r, m, argv, env, wantIn, wantOut)
	if direct && errors.Is(err, mechanism.ErrNotRunning) {
		if err := p.ensureRunning(ctx, r, dir); err != nil {
			return nil, err
		}
		s, err = startPipes(ctx, r, m, argv, env, wantIn, wantOut)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, mechErr("file", err)
	}
	return s, nil
}

func startPipes(ctx context.Context, r *record, m mechanism.Mechanism, argv, env []string, wantIn, wantOut bool) (*inSandbox, error) {
	s := &inSandbox{errBuf: boundedBuf{max: maxErrLine}, waitDone: make(chan struct{})}
	spec := mechanism.ProcessSpec{Argv: argv, Env: env, Dir: "/", Stderr: &s.errBuf}
	var theirs []*os.File
	closeAll := func(fs ...*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	if wantOut {
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.stdout, spec.Stdout = outR, outW
		theirs = append(theirs, outW)
	}
	if wantIn {
		inR, inW, err := os.Pipe()
		if err != nil {
			closeAll(append(theirs, s.stdout)...)
			return nil, err
		}
		s.stdin, spec.Stdin = inW, inR
		theirs = append(theirs, inR)
	}
	proc, err := m.StartProcess(ctx, r.InstanceID, spec)
	// The child holds its own copies now (or failed): ours go, so EOF and
	// EPIPE reach the right ends.
	closeAll(theirs...)
	if err != nil {
		closeAll(s.stdout, s.stdin)
		return nil, err
	}
	s.proc = proc
	// The caller's end kills the command and frees any read or write
	// blocked on its pipes, even one a process of the sandbox's that left
	// the command's group still holds open.
	s.release = context.AfterFunc(ctx, s.kill)
	return s, nil
}

// kill stops the command and unblocks every pipe this side holds.
func (s *inSandbox) kill() {
	s.stopOnce.Do(func() {
		_ = s.proc.Signal(syscall.SIGKILL)
		past := time.Unix(1, 0)
		for _, f := range []*os.File{s.stdin, s.stdout} {
			if f != nil {
				_ = f.SetDeadline(past)
			}
		}
	})
}

// wait waits (at most stepTimeout after a kill, else until ctx ends) for
// the command's exit and the copy of its stderr, and returns its code
// with its stderr line.
func (s *inSandbox) wait(ctx context.Context) (int, string, error) {
	s.waitOnce.Do(func() {
		go func() {
			defer close(s.waitDone)
			s.exit, s.waitErr = s.proc.Wait()
		}()
	})
	select {
	case <-s.waitDone:
	case <-ctx.Done():
		s.kill()
		select {
		case <-s.waitDone:
		case <-time.After(stepTimeout):
		}
		s.finish()
		return 0, "", ctx.Err()
	}
	s.finish()
	var le *mechanism.LimitExceededError
	if s.waitErr != nil && !errors.As(s.waitErr, &le) {
		return 0, "", mechErr("file", s.waitErr)
	}
	return s.exit.Code, s.errBuf.String(), nil
}

// finish releases this side's pipes and the context's hook.
func (s *inSandbox) finish() {
	if s.release != nil {
		s.release()
	}
	past := time.Unix(1, 0)
	for _, f := range []*os.File{s.stdin, s.stdout} {
		if f != nil {
			_ = f.SetDeadline(past)
			f.Close()
		}
	}
}

// stop kills the command and reaps it (bounded).
func (s *inSandbox) stop() {
	s.kill()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	_, _, _ = s.wait(ctx)
}

// runScript runs a script that takes no stream, within stepTimeout, and
// returns its exit as the files API's error.
func (p *Provider) runScript(ctx context.Context, r *record, dir string, m mechanism.Mechanism, name, script string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	s, err := p.startScript(ctx, r, dir, m, false, false, script, args...)
	if err != nil {
		return err
	}
	code, stderr, err := s.wait(ctx)
	if err != nil {
		return err
	}
	return fileCmdErr(name, code, stderr)
}

// openOutside is OpenFile for a path outside the home.
func (p *Provider) openOutside(ctx context.Context, r *record, dir string, m mechanism.Mechanism, name string) (io.ReadCloser, int64, error) {
	s, err := p.startScript(ctx, r, dir, m, false, true, readScript, name)
	if err != nil {
		return nil, 0, err
	}
	f := &outsideFile{s: s, ctx: ctx, name: name}
	size, err := f.sizeLine()
	if err != nil {
		s.stop()
		return nil, 0, err
	}
	f.size, f.left = size, size
	return f, size, nil
}

// outsideFile reads a file a script in the sandbox cats out: at most the
// size it announced, and exactly that or an error.
type outsideFile struct {
	s       *inSandbox
	ctx     context.Context
	name    string
	pending []byte // bytes read past the size line (fewer than maxSizeLine)
	size    int64
	left    int64
	err     error
	closed  bool
}

// sizeLine reads the size line: digits and a newline, nothing else, at
// most maxSizeLine bytes. An exit before it is the script's refusal.
func (f *outsideFile) sizeLine() (int64, error) {
	var buf [maxSizeLine]byte
	n := 0
	for {
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			f.pending = append([]byte(nil), buf[i+1:n]...)
			return parseSize(f.name, buf[:i])
		}
		if n == len(buf) {
			return 0, outsideErr(f.name, fmt.Errorf("no size line: %d bytes without a newline", n))
		}
		m, err := f.s.stdout.Read(buf[n:])
		n += m
		if err != nil && m == 0 {
			if bytes.IndexByte(buf[:n], '\n') >= 0 {
				continue
			}
			code, stderr, werr := f.s.wait(f.ctx)
			switch {
			case werr != nil:
				return 0, werr
			case code != 0:
				return 0, fileCmdErr(f.name, code, stderr)
			}
			return 0, outsideErr(f.name, errors.New("no size line before the end of the output"))
		}
	}
}

// parseSize accepts 1 to 19 ASCII digits.
func parseSize(name string, line []byte) (int64, error) {
	bad := len(line) == 0 || len(line) > 19
	for _, c := range line {
		if c < '0' || c > '9' {
			bad = true
		}
	}
	size, err := strconv.ParseInt(string(line), 10, 64)
	if bad || err != nil {
		return 0, outsideErr(name, fmt.Errorf("a size line of %q", strconv.QuoteToASCII(string(line[:min(len(line), maxSizeLine)]))))
	}
	return size, nil
}

func (f *outsideFile) Read(b []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.left <= 0 {
		return 0, io.EOF
	}
	if len(b) == 0 {
		return 0, nil
	}
	if int64(len(b)) > f.left {
		b = b[:f.left]
	}
	var n int
	var err error
	if len(f.pending) > 0 {
		n = copy(b, f.pending)
		f.pending = f.pending[n:]
	} else {
		n, err = f.s.stdout.Read(b)
	}
	f.left -= int64(n)
	if err != nil && n == 0 {
		// The output ended (or was cut off) before the size announced.
		if cerr := f.ctx.Err(); cerr != nil {
			f.err = cerr
			return 0, f.err
		}
		code, stderr, werr := f.s.wait(f.ctx)
		switch {
		case werr != nil:
			f.err = werr
		case code != 0:
			f.err = fileCmdErr(f.name, code, stderr)
		default:
			f.err = outsideErr(f.name, fmt.Errorf("%w: %d of the %d bytes announced", io.ErrUnexpectedEOF, f.size-f.left, f.size))
		}
		return 0, f.err
	}
	return n, nil
}

// Close kills the script (a reader that stops early leaves no cat
// running behind it) and reaps it.
func (f *outsideFile) Close() error {
	if !f.closed {
		f.closed = true
		f.s.stop()
	}
	return nil
}

// writeOutside is WriteFileFrom for a path outside the home.
func (p *Provider) writeOutside(ctx context.Context, r *record, dir string, m mechanism.Mechanism, name string, src io.Reader, opts sandbox.WriteFileOptions) error {
	mode := opts.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	if path.Dir(name) == "/" && path.Base(name) == "/" {
		return sandbox.Invalid("path", "/ is not a file")
	}
	tmp := path.Join(path.Dir(name), ".managoat-write-"+newID())
	s, err := p.startScript(ctx, r, dir, m, true, false, writeScript, name, tmp)
	if err != nil {
		return err
	}
	var srcErr error
	_, werr := io.CopyBuffer(struct{ io.Writer }{s.stdin}, readerOnly{ctx, src, &srcErr}, make([]byte, streamBuf))
	if srcErr != nil || (werr != nil && !errors.Is(werr, syscall.EPIPE)) {
		// The source failed (or the pipe did, not by the script's own
		// end): the script is killed before anything can rename its file.
		s.stop()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepTimeout)
		defer cancel()
		_ = p.runScript(cctx, r, dir, m, tmp, removeScript, tmp)
		if srcErr != nil {
			return srcErr
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return outsideErr(name, werr)
	}
	// All of the source is in the pipe (or the script ended early, an
	// EPIPE: its exit says why).
	_ = s.stdin.Close()
	code, stderr, err := s.wait(ctx)
	if err == nil {
		err = fileCmdErr(name, code, stderr)
	}
	if err == nil && werr != nil {
		err = outsideErr(name, errors.New("the sandbox stopped reading before the end of the data"))
	}
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepTimeout)
		defer cancel()
		_ = p.runScript(cctx, r, dir, m, tmp, removeScript, tmp)
		return err
	}
	return p.runScript(ctx, r, dir, m, name, renameScript, tmp, name, strconv.FormatUint(uint64(mode), 8))
}
