package e2b

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// JournalDir is where the journaling shim keeps a detachable session's
// output inside the sandbox: <JournalDir>/<tag>.out, .err and .exit. A
// sandbox (or a fake of one) may move it with the environment variable
// JournalDirEnv.
const (
	JournalDir    = "/tmp/fountain"
	JournalDirEnv = "MANAGOAT_JOURNAL_DIR"
)

// Tag prefixes. Sessions (spawns) carry SessionPrefix and are what
// ListSessions shows; exec processes and attach replayers carry their own
// prefixes so they never show up as sessions.
const (
	SessionPrefix = "fountain-"
	execPrefix    = "mgexec-"
	replayPrefix  = "mgreplay-"
	shimMarker    = "# managoat journal shim v1"
)

// Quote renders s as one single-quoted POSIX shell word: every byte is
// passed through intact, an embedded ' becomes '\”.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// QuoteArgv renders argv as a shell command line of single-quoted words.
func QuoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = Quote(a)
	}
	return strings.Join(q, " ")
}

// ShimScript is the bash script that runs argv as a journaled session
// named tag: the command's stdout is copied (appended) to <tag>.out and its
// stderr to <tag>.err while both still reach envd; stdin reaches the
// command directly. When the command ends and both copies are flushed its
// status is written to <tag>.exit (atomically, by rename) and the shim
// exits with it. Run it as `bash -lc <script>`.
//
// The copies go through two FIFOs read by tee, and the shim waits for both
// tees before it writes the exit file, so a reader that sees the exit file
// has seen every byte the journal will ever hold. The shim's own messages
// (bash's "Terminated" for a command killed by a signal) are discarded, so
// stderr carries only the command's bytes.
func ShimScript(tag string, argv []string) string {
	a, _ := json.Marshal(argv)
	enc := base64.StdEncoding.EncodeToString(a)
	return shimMarker + " " + enc + "\n" +
		`d="${` + JournalDirEnv + `:-` + JournalDir + `}"; b="$d/"` + Quote(tag) + "\n" +
		`mkdir -p "$d" && : >>"$b.out" && : >>"$b.err" || exit 125` + "\n" +
		`rm -f "$b.exit" "$b.o" "$b.e"; echo "$$" >"$b.pid"; echo ` + enc + ` >"$b.cmd"; mkfifo "$b.o" "$b.e" || exit 125` + "\n" +
		`exec 9>&2 2>/dev/null` + "\n" +
		`tee -a "$b.out" <"$b.o" 9>&- & to=$!` + "\n" +
		`tee -a "$b.err" <"$b.e" >&9 9>&- & te=$!` + "\n" +
		QuoteArgv(argv) + ` >"$b.o" 2>"$b.e" 9>&-` + "\n" +
		`s=$?` + "\n" +
		`wait "$to" "$te"; rm -f "$b.o" "$b.e"` + "\n" +
		`echo "$s" >"$b.exit.tmp" && mv -f "$b.exit.tmp" "$b.exit"` + "\n" +
		`exit "$s"` + "\n"
}

// ReplayScript is the bash script an attach runs: it copies tag's journals
// from byte zero (stdout journal to fd 1, stderr journal to fd 2), follows
// them while the session runs, and ends once the exit file appeared, or the
// shim died without writing one, and both copies drained. tail's --pid
// makes each follower read to the end once more after the watcher is gone,
// so nothing written before the exit file is lost and no grace sleep is
// needed. It exits 44 when tag has no journal.
func ReplayScript(tag string) string {
	return "# managoat journal replay v1\n" +
		`d="${` + JournalDirEnv + `:-` + JournalDir + `}"; b="$d/"` + Quote(tag) + "\n" +
		`[ -e "$b.out" ] || [ -e "$b.exit" ] || exit 44` + "\n" +
		`: >>"$b.out"; : >>"$b.err"` + "\n" +
		`p=$(cat "$b.pid" 2>/dev/null)` + "\n" +
		`( while [ ! -e "$b.exit" ] && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; do sleep 0.1; done ) & w=$!` + "\n" +
		`tail -s 0.1 -c +1 -f --pid="$w" "$b.out" & t1=$!` + "\n" +
		`tail -s 0.1 -c +1 -f --pid="$w" "$b.err" >&2 & t2=$!` + "\n" +
		`wait "$t1" "$t2"` + "\n" +
		`exit 0` + "\n"
}

// isShim reports whether a listed process is a journaled session.
func isShim(c *processConfig) bool {
	if c == nil || len(c.Args) < 2 {
		return false
	}
	return strings.HasPrefix(c.Args[len(c.Args)-1], shimMarker)
}

// shimArgv recovers the session's own command line from a shim process.
func shimArgv(c *processConfig) []string {
	if !isShim(c) {
		return nil
	}
	line, _, _ := strings.Cut(c.Args[len(c.Args)-1], "\n")
	return decodeArgv(strings.TrimPrefix(line, shimMarker))
}

// decodeArgv decodes the shim's base64 JSON rendering of a command line.
func decodeArgv(s string) []string {
	f := strings.Fields(s)
	if len(f) != 1 {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(f[0])
	if err != nil {
		return nil
	}
	var argv []string
	if json.Unmarshal(b, &argv) != nil {
		return nil
	}
	return argv
}
