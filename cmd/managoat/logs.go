package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("logs", "[flags] NAME [SESSION]", "Print a session's output (the newest session's without SESSION); --follow tails it", cmdLogs)
}

// caughtUp is how long a replay may pause before logs takes what it
// printed as all there is so far: the contract's Attach replays from byte
// zero and then tails with no mark between the two, so a running
// session's replay is over when its output pauses this long.
const caughtUp = 300 * time.Millisecond

// sortedSessions is h's sessions, oldest first (newest last), on every
// provider whatever order it lists them in.
func sortedSessions(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) ([]sandbox.Session, error) {
	ss, err := reg.ListSessions(ctx, h)
	if err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			return nil, fmt.Errorf("sandbox %q: %w", h.Name, err)
		}
		return nil, wrap("sessions", err)
	}
	slices.SortStableFunc(ss, func(a, b sandbox.Session) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		an, aerr := strconv.Atoi(a.ID[min(1, len(a.ID)):])
		bn, berr := strconv.Atoi(b.ID[min(1, len(b.ID)):])
		if aerr == nil && berr == nil {
			return an - bn
		}
		return 0
	})
	return ss, nil
}

// parseSince reads --since: a duration back from now (10m) or a time
// (RFC 3339, or 2006-01-02 15:04:05 local).
func parseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateTime, s, time.Local); err == nil {
		return t, nil
	}
	return time.Time{}, usageError{msg: fmt.Sprintf("--since %q is neither a duration such as 10m nor a time such as 2006-01-02T15:04:05Z", s)}
}

func cmdLogs(g *globals, fs *flag.FlagSet) action {
	follow := fs.Bool("follow", false, "keep printing the session's output as it comes, until it ends (Ctrl-C stops)")
	fs.BoolVar(follow, "f", false, "the same as --follow")
	tail := fs.Int("tail", -1, "print only the last `N` lines of what was output so far (default all)")
	since := fs.String("since", "", "without SESSION, every session started since `T` (10m, or a time), oldest first")
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 2)
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		if len(pos) == 0 {
			return usageError{msg: "missing NAME"}
		}
		var from time.Time
		if *since != "" {
			if from, err = parseSince(*since); err != nil {
				return err
			}
		}
		reg, h, err := handleFor(g, pos[0])
		if err != nil {
			return err
		}
		var ids []string
		if len(pos) == 2 {
			ids = []string{pos[1]}
		} else {
			ss, err := sortedSessions(ctx, reg, h)
			if err != nil {
				return err
			}
			for _, s := range ss {
				if *since == "" || !s.CreatedAt.Before(from) {
					ids = append(ids, s.ID)
				}
			}
			if *since == "" && len(ids) > 1 {
				ids = ids[len(ids)-1:]
			}
			if len(ids) == 0 {
				return fmt.Errorf("sandbox %q has no session%s: %w", h.Name, map[bool]string{true: " started since " + *since}[*since != ""], sandbox.ErrNotFound)
			}
		}
		for i, id := range ids {
			if len(ids) > 1 {
				if i > 0 {
					fmt.Println()
				}
				fmt.Printf("==> %s <==\n", id)
			}
			// Only the last session of several is followed.
			err := printLogs(ctx, reg, h, id, *follow && i == len(ids)-1, *tail)
			if len(ids) > 1 && errors.Is(err, sandbox.ErrNotFound) {
				// One session of several (a pruned one): said, and the
				// others shown.
				fmt.Fprintln(os.Stderr, errorLine("logs", err))
				continue
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// printLogs prints session id's output: all of it, or its last tail lines
// (tail < 0: all), then, with follow, what comes until it ends.
func printLogs(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, id string, follow bool, tail int) error {
	cmd, err := reg.Attach(ctx, h, id, sandbox.AttachOptions{})
	if err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			return fmt.Errorf("logs: session %q of sandbox %q: %w", id, h.Name, err)
		}
		return wrap("logs", err)
	}
	defer func() { _ = cmd.Stop() }()
	var held []chunk                        // the replay, while tail holds it back
	stdout, stderr := sessionOutputs(false) // termfilter.go: a workload's escapes do not drive the terminal
	defer stdout.Flush()
	defer stderr.Flush()
	emit := func(c chunk) {
		w := stdout
		if c.stderr {
			w = stderr
		}
		_, _ = w.Write(c.data)
	}
	flush := func() {
		if tail < 0 {
			return
		}
		for _, c := range lastLines(held, tail) {
			emit(c)
		}
		held, tail = nil, -1
	}
	idle := time.NewTimer(caughtUp)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a follow
		case <-idle.C:
			flush()
			if !follow {
				return nil
			}
		case ev, ok := <-cmd.Events():
			if !ok {
				flush()
				return wrap("logs", sandbox.ClosedBeforeExit())
			}
			idle.Reset(caughtUp)
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
				c := chunk{ev.Kind == sandbox.Stderr, ev.Data}
				if tail >= 0 {
					held = append(held, c)
				} else {
					emit(c)
				}
			case sandbox.Exit:
				flush()
				return nil
			case sandbox.Error:
				flush()
				if sandbox.IsClosedBeforeExit(ev.Err) {
					return nil // what there was is printed; it ended with no status
				}
				return wrap("logs", ev.Err)
			}
		}
	}
}

type chunk struct {
	stderr bool
	data   []byte
}

// lastLines is the end of held holding its last n lines, across both
// streams (an unended last line counts as one).
func lastLines(held []chunk, n int) []chunk {
	var pieces []chunk // each ends with a newline, or is a line's unended part
	for _, c := range held {
		d := c.data
		for len(d) > 0 {
			i := bytes.IndexByte(d, '\n')
			if i < 0 {
				pieces = append(pieces, chunk{c.stderr, d})
				break
			}
			pieces = append(pieces, chunk{c.stderr, d[:i+1]})
			d = d[i+1:]
		}
	}
	lines, i := 0, len(pieces)
	for ; i > 0; i-- {
		p := pieces[i-1].data
		if p[len(p)-1] == '\n' || i == len(pieces) { // a line ends here
			if lines == n {
				break
			}
			lines++
		}
	}
	return pieces[i:]
}

// sessionRow is one session as sessions prints it.
type sessionRow struct {
	ID             string     `json:"id"`
	State          string     `json:"state,omitempty"`
	ExitCode       *int       `json:"exit_code,omitempty"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	LastActivityAt *time.Time `json:"last_activity_at,omitempty"`
	Command        string     `json:"command"`
	TTY            bool       `json:"tty"`
}

func cmdSessions(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	return func(ctx context.Context, args []string) error {
		reg, h, _, err := sandboxArgs(g, fs, args, 1, "NAME")
		if err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		ss, err := sortedSessions(ctx, reg, h)
		if err != nil {
			return err
		}
		rows := make([]sessionRow, 0, len(ss))
		for _, s := range ss {
			r := sessionRow{ID: s.ID, State: s.State, Command: s.Command, TTY: s.TTY}
			if s.State == sandbox.SessionExited {
				code := s.ExitCode
				r.ExitCode = &code
			}
			if !s.CreatedAt.IsZero() {
				t := s.CreatedAt.UTC()
				r.CreatedAt = &t
			}
			if !s.LastActivityAt.IsZero() {
				t := s.LastActivityAt.UTC()
				r.LastActivityAt = &t
			}
			rows = append(rows, r)
		}
		if of.json() {
			return json.NewEncoder(os.Stdout).Encode(rows)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SESSION\tSTATE\tEXIT\tSTARTED\tCOMMAND")
		for _, r := range rows {
			state, exit, started := "-", "-", "-"
			if r.State != "" {
				state = r.State
			}
			if r.ExitCode != nil {
				exit = strconv.Itoa(*r.ExitCode)
			}
			if r.CreatedAt != nil {
				started = r.CreatedAt.Local().Format(time.DateTime)
			}
			// One row a session: a multi-line command is escaped (output.go).
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(r.ID), cell(state), exit, started, cell(r.Command))
		}
		return tw.Flush()
	}
}
