package daytona

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// This file renders everything the adapter runs inside a sandbox. Every
// script is POSIX sh (Daytona's session shell is /bin/sh; no bashisms).
//
// Transport: Daytona's /process/execute does not run a shell — it splits
// the command string on spaces with a naive quote toggle (no escapes), and
// JSON turns non-UTF-8 bytes into U+FFFD. So every script travels
// base64-encoded inside one fixed, parser-safe envelope:
//
//	sh -c 'eval "$(printf %s <base64> | base64 -d)"'
//
// whose only variable part is the base64 alphabet. The command line inside
// the script is single-quoted word by word ('\'' for an embedded quote), so
// quotes, newlines and arbitrary bytes (but NUL, which no argv can hold)
// reach the process intact.

// sessionPrefix marks the sessions this adapter creates; ListSessions keeps
// only those.
const sessionPrefix = "managoat-"

// maxScript bounds a rendered script: its base64 form is one argument of
// sh -c, and Linux caps a single argument at 128 KiB.
const maxScript = 90 << 10

// stdinChunk is the most stdin bytes sent in one append (base64 inside the
// script, base64 again in the envelope).
const stdinChunk = 32 << 10

// Markers printed by the adapter's scripts.
const (
	markExited = "MANAGOAT_EXITED"
	markOK     = "MANAGOAT_OK"
	markOut    = "MANAGOAT_OUT"
)

// isShellName reports whether k is a shell identifier,
// ^[A-Za-z_][A-Za-z0-9_]*$. This file's matchers are loops rather than
// package-level regexps, which the CLI (it links this package) paid for at
// every process start.
func isShellName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// isBase64Byte reports whether c is in [A-Za-z0-9+/=].
func isBase64Byte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '='
}

// base64Prefix is the length of the longest prefix of s made of [A-Za-z0-9+/=].
func base64Prefix(s string) int {
	n := 0
	for n < len(s) && isBase64Byte(s[n]) {
		n++
	}
	return n
}

// quote single-quotes s for POSIX sh: an embedded ' becomes '\”.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// commandLine renders c with env and dir as one sh command list:
// [cd 'dir' && ][K='v' ...]'name' 'arg'... . It refuses what no shell could
// carry: an empty name, a NUL byte, an env entry without '=' or with a key
// that is not a shell identifier.
func commandLine(c sandbox.Cmd, env []string, dir string) (string, error) {
	if c.Name == "" {
		return "", sandbox.Invalid("command", "empty command name")
	}
	var b strings.Builder
	if dir != "" {
		if strings.ContainsRune(dir, 0) {
			return "", sandbox.Invalid("command", "working directory contains a NUL byte")
		}
		b.WriteString("cd " + quote(dir) + " && ")
	}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !isShellName(k) {
			return "", sandbox.Invalid("command", fmt.Sprintf("env entry %q is not KEY=VALUE with a shell identifier as KEY", clip(kv, 40)))
		}
		if strings.ContainsRune(v, 0) {
			return "", sandbox.Invalid("command", fmt.Sprintf("env %s contains a NUL byte", k))
		}
		b.WriteString(k + "=" + quote(v) + " ")
	}
	for i, w := range c.Argv() {
		if strings.ContainsRune(w, 0) {
			return "", sandbox.Invalid("command", fmt.Sprintf("argument %d contains a NUL byte", i))
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(w))
	}
	return b.String(), nil
}

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// envelope wraps a script for transport (see the file comment). Extra
// words, already safe for both parsers, follow as $0, $1… of sh -c.
func envelope(script string, extra ...string) (string, error) {
	if len(script) > maxScript {
		return "", sandbox.Invalid("command", fmt.Sprintf("rendered script is %d bytes, over %d", len(script), maxScript))
	}
	s := `sh -c 'eval "$(printf %s ` + base64.StdEncoding.EncodeToString([]byte(script)) + ` | base64 -d)"'`
	for _, w := range extra {
		s += " " + w
	}
	return s, nil
}

// envelopePayload finds the first `printf %s PAYLOAD | base64 -d` in s, as
// the regexp `printf %s ([A-Za-z0-9+/=]+) \| base64 -d` would, and returns
// PAYLOAD.
func envelopePayload(s string) (string, bool) {
	const head, tail = "printf %s ", " | base64 -d"
	for {
		i := strings.Index(s, head)
		if i < 0 {
			return "", false
		}
		s = s[i+len(head):]
		if n := base64Prefix(s); n > 0 && strings.HasPrefix(s[n:], tail) {
			return s[:n], true
		}
	}
}

// unwrap returns the script inside an envelope, for tests and diagnostics.
func unwrap(s string) (string, bool) {
	payload, ok := envelopePayload(s)
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(payload)
	return string(b), err == nil
}

// displayCommand recovers the user's command line from a session command
// record (spawn appends it, base64-encoded, after the envelope); anything
// else is returned as it is. The tag is `' managoat PAYLOAD` at the very end
// (the regexp `' managoat ([A-Za-z0-9+/=]+)$`): PAYLOAD is the record's
// longest [A-Za-z0-9+/=] suffix, as the tag ends in a space.
func displayCommand(recorded string) string {
	const tag = "' managoat "
	i := len(recorded)
	for i > 0 && isBase64Byte(recorded[i-1]) {
		i--
	}
	if i < len(recorded) && strings.HasSuffix(recorded[:i], tag) {
		if b, err := base64.StdEncoding.DecodeString(recorded[i:]); err == nil {
			return string(b)
		}
	}
	return recorded
}

// shimBase is the shell expression of a session's shim path prefix.
func shimBase(dir, tag string) string {
	if dir == "" {
		return `"${TMPDIR:-/tmp}/managoat/` + tag + `"`
	}
	return quote(strings.TrimRight(dir, "/") + "/" + tag)
}

// shimDirExpr is the shell expression of the shims' directory.
func shimDirExpr(dir string) string {
	if dir == "" {
		return `"${TMPDIR:-/tmp}/managoat"`
	}
	return quote(strings.TrimRight(dir, "/"))
}

// execScript runs line with stdin from /dev/null, captures its output
// (stderr merged or dropped) in a temporary file, and prints the marker then
// the output base64-encoded, so every byte survives JSON; it exits with the
// command's status.
func execScript(line string, stderrToStdout bool) string {
	errRedir := "2>/dev/null"
	if stderrToStdout {
		errRedir = "2>&1"
	}
	return `o=$(mktemp 2>/dev/null) || o="${TMPDIR:-/tmp}/managoat-exec-$$"
( ` + line + ` ) </dev/null >"$o" ` + errRedir + `
c=$?
echo ` + markOut + `
base64 <"$o"
rm -f "$o"
exit $c
`
}

// decodeExecResult parses execScript's printed result.
func decodeExecResult(result string) ([]byte, error) {
	i := strings.Index(result, markOut+"\n")
	if i < 0 {
		return nil, errors.New("exec output marker missing")
	}
	payload := strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == ' ' {
			return -1
		}
		return r
	}, result[i+len(markOut)+1:])
	return base64.StdEncoding.DecodeString(payload)
}

// spawnScript is the session shim. It records the user's command line
// (its base64 form is the envelope's $1) in <base>.cmd and its own pid (so
// a shim that died without a verdict is detectable; published by rename,
// like every pid file here, so that a poll never reads it empty and takes
// a starting shim for a dead one), runs line with its
// stdout and stderr going straight into <base>.out and <base>.err, and
// writes the status to <base>.code (atomically, via rename) before exiting
// with it. The LogStream reads the two files by offset: the daemon's own
// log of a session command is labelled line by line by a shell read loop,
// which holds back a partial line, adds a newline to the last one and
// drops NUL bytes — the files keep every byte, as it is written.
//
// With stdin, line reads a FIFO <base>.p fed by `tail -c +1 -f <base>.in`
// (WriteStdin appends to <base>.in). Where tail supports --pid (GNU), the
// tail follows a holder process and CloseStdin kills the holder: tail then
// drains what was appended and exits, so the EOF never loses a write that
// came before it. Elsewhere CloseStdin kills the tail itself. A close that
// comes before the shim started leaves <base>.eof, which the shim honours.
// Without stdin, line reads /dev/null (never the session shell's own input).
func spawnScript(base, line string, stdin bool) string {
	var b strings.Builder
	b.WriteString("B=" + base + "\n")
	b.WriteString(`mkdir -p "${B%/*}" && : >"$B.out" && : >"$B.err" || exit 125` + "\n")
	b.WriteString(`printf '%s\n' "$1" >"$B.cmd"` + "\n")
	b.WriteString(`echo $$ >"$B.pid.t" && mv -f "$B.pid.t" "$B.pid" || exit 125` + "\n")
	if stdin {
		b.WriteString(`[ -p "$B.p" ] || mkfifo "$B.p" || exit 125
: >>"$B.in"
h=
if tail --pid=$$ -c +1 /dev/null >/dev/null 2>&1; then
  sleep 2147483647 </dev/null >/dev/null 2>&1 &
  h=$!
  echo $h >"$B.hold.t" && mv -f "$B.hold.t" "$B.hold"
  tail -s 0.1 --pid=$h -c +1 -f "$B.in" >"$B.p" 2>/dev/null &
else
  tail -c +1 -f "$B.in" >"$B.p" 2>/dev/null &
fi
t=$!
echo $t >"$B.tailpid.t" && mv -f "$B.tailpid.t" "$B.tailpid"
if [ -e "$B.eof" ]; then kill ${h:-$t} 2>/dev/null; fi
( ` + line + ` ) <"$B.p" >>"$B.out" 2>>"$B.err"
c=$?
kill $t $h 2>/dev/null
`)
	} else {
		b.WriteString(`( ` + line + ` ) </dev/null >>"$B.out" 2>>"$B.err"
c=$?
`)
	}
	b.WriteString(`echo $c >"$B.code.t" && mv -f "$B.code.t" "$B.code"
exit $c
`)
	return b.String()
}

// stdinScript appends data to <base>.in unless the sentinel says the
// command exited.
func stdinScript(base string, data []byte) string {
	return "B=" + base + `
if [ -e "$B.code" ]; then echo ` + markExited + `; exit 0; fi
mkdir -p "${B%/*}" && printf %s '` + base64.StdEncoding.EncodeToString(data) + `' | base64 -d >>"$B.in" && echo ` + markOK + `
`
}

// closeScript delivers a real EOF: it leaves <base>.eof (for a shim not yet
// started) and kills the holder, or the tail where there is none. It does
// nothing once the sentinel exists: the shim has ended its holder and tail,
// and the pids in its files may since belong to other processes. The tail's
// pid is read before the holder's: the shim publishes the holder before it
// starts the tail, so a close that sees the tail also sees the holder and
// never kills the tail (which would drop what it had not yet passed on)
// where a holder exists.
func closeScript(base string) string {
	return "B=" + base + `
if [ -e "$B.code" ]; then exit 0; fi
mkdir -p "${B%/*}" && : >"$B.eof"
t=$(cat "$B.tailpid" 2>/dev/null)
h=$(cat "$B.hold" 2>/dev/null)
if [ -n "$h" ]; then kill "$h" 2>/dev/null; elif [ -n "$t" ]; then kill "$t" 2>/dev/null; fi
exit 0
`
}

// shimState is the shell fragment that sets s to the shim's liveness:
// alive, dead, or nopid while <base>.pid is absent or empty. The shim
// publishes its pid by rename, so a reader never sees the file half
// written; an empty file (a shim of an earlier version, which wrote it in
// place, caught between the truncation and the write) still counts as not
// started, never as dead.
const shimState = `s=nopid
p=$(cat "$B.pid" 2>/dev/null)
if [ -n "$p" ]; then if kill -0 "$p" 2>/dev/null; then s=alive; else s=dead; fi; fi
`

// probeScript reports the shim's liveness (alive, dead or nopid) on its
// first line and the sentinel's content after it. Liveness is read first:
// a shim writes the sentinel before it dies, so "dead" with no sentinel
// means it died without a verdict.
func probeScript(base string) string {
	return "B=" + base + "\n" + shimState + `echo $s
cat "$B.code" 2>/dev/null
exit 0
`
}

// readScript is one poll of a session: its first line is the shim's
// liveness (alive, dead or nopid) and the sentinel's content (or "-"),
// read in that order and before the output, so that a verdict seen here
// comes with all the output written before it; then, after a markOut line
// each, the bytes of <base>.out and <base>.err from the given offsets, at
// most max of each, base64-encoded.
func readScript(base string, off [2]int, max int) string {
	return "B=" + base + "\n" + shimState + `c=$(cat "$B.code" 2>/dev/null)
echo "$s ${c:--}"
echo ` + markOut + `
tail -c +` + fmt.Sprint(off[0]+1) + ` "$B.out" 2>/dev/null | head -c ` + fmt.Sprint(max) + ` | base64
echo ` + markOut + `
tail -c +` + fmt.Sprint(off[1]+1) + ` "$B.err" 2>/dev/null | head -c ` + fmt.Sprint(max) + ` | base64
exit 0
`
}

// parseRead splits readScript's result.
func parseRead(res string) (state, code string, out, errs []byte, err error) {
	parts := strings.Split(res, markOut+"\n")
	if len(parts) != 3 {
		return "", "", nil, nil, fmt.Errorf("session read has %d sections, want 3", len(parts))
	}
	state, code, _ = strings.Cut(strings.TrimSpace(parts[0]), " ")
	dec := func(s string) ([]byte, error) {
		return base64.StdEncoding.DecodeString(strings.Map(func(r rune) rune {
			if r == '\n' || r == '\r' || r == ' ' {
				return -1
			}
			return r
		}, s))
	}
	if out, err = dec(parts[1]); err != nil {
		return "", "", nil, nil, err
	}
	if errs, err = dec(parts[2]); err != nil {
		return "", "", nil, nil, err
	}
	return state, code, out, errs, nil
}

// hasFilesScript prints markOK when the session has this shim's output
// files (an older shim's session has only the daemon's log).
func hasFilesScript(base string) string {
	return "B=" + base + `
if [ -f "$B.out" ] && [ -f "$B.err" ]; then echo ` + markOK + `; fi
exit 0
`
}

// listScript prints "<tag> <base64 command line> <done|running>" for every
// session whose shim recorded its command in the shim directory; done
// means its sentinel exists.
func listScript(dirExpr string) string {
	return "D=" + dirExpr + `
for f in "$D"/` + sessionPrefix + `*.cmd; do
  [ -f "$f" ] || continue
  n=${f##*/}
  n=${n%.cmd}
  d=running
  [ -f "$D/$n.code" ] && d=done
  printf '%s %s %s\n' "$n" "$(cat "$f")" "$d"
done
exit 0
`
}
