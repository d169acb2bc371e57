package sandboxtest

import (
	"bytes"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// next returns c's next event, failing t after the suite timeout. A closed
// channel before a terminal event fails t: the contract promises exactly one
// terminal event before the close.
func (s *suite) next(t *testing.T, c *sandbox.Command) sandbox.Event {
	t.Helper()
	timer := time.NewTimer(s.cfg.timeout)
	defer timer.Stop()
	select {
	case ev, ok := <-c.Events():
		if !ok {
			t.Fatalf("%v: event channel closed before a terminal event", c)
		}
		if ev.Ref != c.Ref {
			t.Fatalf("%v: event %v carries ref %q, want %q", c, ev.Kind, ev.Ref, c.Ref)
		}
		return ev
	case <-timer.C:
		t.Fatalf("%v: no event within %v", c, s.cfg.timeout)
	}
	panic("unreachable")
}

// waitStdout reads events until a stdout event and returns its data; it
// fails on a terminal event.
func (s *suite) waitStdout(t *testing.T, c *sandbox.Command) []byte {
	t.Helper()
	for {
		ev := s.next(t, c)
		switch ev.Kind {
		case sandbox.Stdout:
			return ev.Data
		case sandbox.Exit, sandbox.Error:
			t.Fatalf("%v: terminal %v (code %d, err %v) before the expected stdout", c, ev.Kind, ev.Code, ev.Err)
		}
	}
}

// waitStdoutContaining reads stdout until the accumulated bytes contain
// want.
func (s *suite) waitStdoutContaining(t *testing.T, c *sandbox.Command, want string) {
	t.Helper()
	var got bytes.Buffer
	for !bytes.Contains(got.Bytes(), []byte(want)) {
		ev := s.next(t, c)
		switch ev.Kind {
		case sandbox.Stdout:
			got.Write(ev.Data)
		case sandbox.Exit, sandbox.Error:
			t.Fatalf("%v: terminal %v before stdout contained %q (got %q)", c, ev.Kind, want, got.String())
		}
	}
}

// transcript is what a command produced up to and including its terminal
// event.
type transcript struct {
	stdout, stderr bytes.Buffer
	terminal       sandbox.Event
}

// finish reads c to its end and checks the stream rules: every event
// carries c's ref, output only before the terminal event, exactly one
// terminal event, then the channel closes.
func (s *suite) finish(t *testing.T, c *sandbox.Command) *transcript {
	t.Helper()
	tr := &transcript{}
	for {
		ev := s.next(t, c)
		switch ev.Kind {
		case sandbox.Stdout:
			tr.stdout.Write(ev.Data)
		case sandbox.Stderr:
			tr.stderr.Write(ev.Data)
		case sandbox.Exit, sandbox.Error:
			tr.terminal = ev
			s.expectClosed(t, c)
			return tr
		default:
			t.Fatalf("%v: event of unknown kind %v", c, ev.Kind)
		}
	}
}

// expectClosed checks that nothing follows the terminal event: the channel
// closes without another event.
func (s *suite) expectClosed(t *testing.T, c *sandbox.Command) {
	t.Helper()
	timer := time.NewTimer(s.cfg.timeout)
	defer timer.Stop()
	select {
	case ev, ok := <-c.Events():
		if ok {
			t.Fatalf("%v: event %v after the terminal event", c, ev.Kind)
		}
	case <-timer.C:
		t.Fatalf("%v: channel not closed within %v after the terminal event", c, s.cfg.timeout)
	}
}

func (s *suite) wantExit(t *testing.T, tr *transcript, code int) {
	t.Helper()
	if tr.terminal.Kind != sandbox.Exit {
		t.Fatalf("terminal event is %v (%v), want exit %d", tr.terminal.Kind, tr.terminal.Err, code)
	}
	if tr.terminal.Code != code {
		t.Fatalf("exit code %d, want %d", tr.terminal.Code, code)
	}
}
