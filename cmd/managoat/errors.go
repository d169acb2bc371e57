package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// Exit codes as docker and the shells use them. The library keeps a
// command that could not run an error (Invalid{could_not_run}); these are
// only how the CLI renders it.
const (
	exitTimeout      = 124 // --timeout ended the command (as timeout(1))
	exitCannotInvoke = 126 // the command exists but cannot be run (not executable)
	exitCmdNotFound  = 127 // no such command in the sandbox
)

// exitCode is the exit code managoat ends with for err, a failure of
// managoat's own (not the command's exit code, which exitError carries).
func exitCode(err error) int {
	switch {
	case sandbox.IsExecTimeout(err):
		return exitTimeout
	case couldNotRun(err) && strings.Contains(err.Error(), "executable "):
		msg := err.Error()
		switch {
		case strings.Contains(msg, "not found"), strings.Contains(msg, "no such file or directory"):
			return exitCmdNotFound
		case strings.Contains(msg, "permission denied"), strings.Contains(msg, "exec format error"),
			strings.Contains(msg, "is a directory"), strings.Contains(msg, "not a directory"):
			return exitCannotInvoke
		}
	}
	return exitCouldNotRun
}

func couldNotRun(err error) bool {
	var ie *sandbox.InvalidError
	return errors.As(err, &ie) && ie.Reason == "could_not_run"
}

// errorLine renders err as one line: what failed, the taxonomy kind (with
// its reason) in parentheses, and what to do next, without the prefixes the
// layers add ("sandbox: ", "mechanism: ", the command's own name).
func errorLine(cmd string, err error) string {
	kind := sandbox.Kind(err)
	tag := kind
	msg := err.Error()
	var (
		ie *sandbox.InvalidError
		ue *sandbox.UnavailableError
	)
	switch {
	case errors.As(err, &ie):
		tag = "invalid " + ie.Reason
		msg = strings.Replace(msg, "sandbox: invalid "+ie.Reason+": ", "", 1)
		msg = strings.Replace(msg, "sandbox: invalid "+ie.Reason, "invalid "+ie.Reason, 1)
	case errors.As(err, &ue) && ue.Reason == sandbox.ReasonExecTimeout:
		tag = "unavailable " + ue.Reason
		if ue.Timeout > 0 {
			msg = strings.Replace(msg, ue.Error(), fmt.Sprintf("the command ran out of its time budget of %v", ue.Timeout), 1)
		} else {
			msg = strings.Replace(msg, ue.Error(), "the command ran out of its time budget", 1)
		}
	case errors.As(err, &ue):
		tag = "unavailable " + ue.Reason
		msg = strings.Replace(msg, "sandbox: unavailable: "+ue.Reason+": ", "", 1)
	}
	for _, p := range []string{"sandbox: ", "mechanism: ", "could not run: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	// The command's own name is already the line's prefix.
	msg = strings.TrimPrefix(msg, cmd+": ")
	line := fmt.Sprintf("managoat %s: %s (%s)", cmd, msg, tag)
	if h := hint(cmd, err, kind); h != "" {
		line += "; " + h
	}
	return line
}

// hint says what to do next about err, of the given kind.
func hint(cmd string, err error, kind string) string {
	var ie *sandbox.InvalidError
	switch {
	case cmd == "cp" && (kind == "denied" || kind == "invalid" || kind == "not_found" && !strings.Contains(err.Error(), "sandbox \"")):
		return "check the path: the sandbox's user must be able to read it, or to write where it goes"
	case sandbox.IsExecTimeout(err):
		return "give it a longer --timeout"
	case errors.As(err, &ie) && ie.Reason == "command" && strings.Contains(err.Error(), "fake: "):
		// The fake runs no program: what looks like a command is its script.
		return "the fake provider runs no program: a command's arguments are its script (out:TEXT err:TEXT exit:N sleep:D env:KEY pwd stay drop); --provider local runs real commands"
	case couldNotRun(err):
		switch exitCode(err) {
		case exitCmdNotFound:
			return "check the command's name, or give its full path"
		case exitCannotInvoke:
			return "make it executable (chmod +x), or run it through its interpreter"
		}
		return "managoat doctor shows what this host can run"
	case kind == "not_found" && strings.Contains(err.Error(), "checkpoint \""):
		return "managoat checkpoint ls NAME lists the sandbox's checkpoints"
	case kind == "not_found" && strings.Contains(err.Error(), "session"):
		return "managoat sessions NAME lists the sandbox's sessions"
	case kind == "not_found":
		return "managoat ls lists the sandboxes; managoat create NAME makes one"
	case kind == "already_exists":
		return "use another name, or managoat rm the existing one"
	case kind == "not_supported":
		return "this provider cannot do it; see the providers in the README"
	case kind == "rate_limited":
		return "wait, then try again"
	case kind == "denied":
		return "check the provider's credentials"
	case kind == "truncated":
		return "try again; the sources named did not answer"
	case errors.As(err, &ie) && ie.Reason == sandbox.ReasonProvider:
		return "pick one with --provider or MANAGOAT_PROVIDER"
	case kind == "unavailable":
		return "try again; managoat doctor shows what this host can run"
	}
	return ""
}
