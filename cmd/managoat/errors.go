package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/managoat/managoat/runner"
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

// hint says what to do next about err, of the given kind: the thing that
// helps for that error (managoat doctor only for what this host cannot
// isolate).
func hint(cmd string, err error, kind string) string {
	var (
		ie *sandbox.InvalidError
		ue *sandbox.UnavailableError
	)
	msg := err.Error()
	remote := current.provider == "runner" || strings.HasPrefix(current.provider, "platform")
	switch {
	case cmd == "cp" && (kind == "denied" || kind == "invalid" || kind == "not_found" && !strings.Contains(msg, "sandbox \"")):
		return "check the path: the sandbox's user must be able to read it, or to write where it goes"
	case sandbox.IsExecTimeout(err):
		return "give it a longer --timeout"
	case errors.As(err, &ie) && ie.Reason == "command" && strings.Contains(msg, "fake: "):
		// The fake runs no program: what looks like a command is its script.
		return "the fake provider runs no program: a command's arguments are its script (out:TEXT err:TEXT exit:N sleep:D env:KEY pwd stay drop); --provider local runs real commands"
	case couldNotRun(err):
		switch exitCode(err) {
		case exitCmdNotFound:
			return "check the command's name, or give its full path"
		case exitCannotInvoke:
			return "make it executable (chmod +x), or run it through its interpreter"
		}
		if strings.Contains(msg, "working directory") {
			return "give a -w that exists in the sandbox (create -w makes its directory)"
		}
		return "check the command, its working directory (-w) and its environment (-e)"
	case errors.As(err, &ie) && ie.Reason == "dir":
		return "give -w a directory the sandbox's user may make, such as one under /home/sprite or /tmp"
	case errors.As(err, &ie) && ie.Reason == "capability_unavailable":
		return "managoat doctor shows what this host can isolate, or pick another --mechanism"
	case errors.As(err, &ue) && ue.Reason == "no_runner_online":
		return "start a runner for this account (managoat runner --url URL --token-file FILE, with the account's API key or an enrolment made with enroll --account ACCOUNT NAME), then try again"
	case errors.As(err, &ue) && ue.Reason == "registry":
		return "check the image's name, and that this host reaches its registry (a proxy: HTTPS_PROXY)"
	case errors.As(err, &ue) && ue.Reason == sandbox.ReasonTransport && remote:
		return "check that managoat serve runs at " + platformURL() + " (MANAGOAT_URL), then try again"
	case errors.As(err, &ue) && ue.Reason == sandbox.ReasonTransport:
		return "check this host's network and the provider's status, then try again"
	case cmd == "image" && kind == "not_found" && strings.Contains(msg, "image "):
		return "managoat image ls lists the images here; managoat image pull REF fetches one"
	case kind == "not_found" && strings.Contains(msg, "checkpoint \""):
		return "managoat checkpoint ls NAME lists the sandbox's checkpoints"
	case kind == "not_found" && strings.Contains(msg, "session"):
		return "managoat sessions NAME lists the sandbox's sessions"
	case kind == "not_found":
		return "managoat ls lists the sandboxes; managoat create NAME makes one"
	case kind == "already_exists":
		return "use another name, or managoat rm the existing one"
	case kind == "not_supported":
		return "provider " + current.provider + " cannot do it; the README's providers section says which can"
	case kind == "rate_limited":
		return "wait, then try again"
	case kind == "denied" && strings.HasPrefix(current.provider, "platform"):
		return "check MANAGOAT_API_KEY: a key of your account that is not revoked (managoat serve admin key ls ACCOUNT)"
	case kind == "denied":
		return "check the provider's credentials"
	case kind == "truncated":
		return "try again; the sources named did not answer"
	case errors.As(err, &ie) && ie.Reason == sandbox.ReasonProvider:
		return "pick one with --provider or MANAGOAT_PROVIDER"
	case kind == "unavailable":
		return "try again"
	}
	return ""
}

// platformURL is the platform the runner and platform providers reach.
func platformURL() string {
	if u := os.Getenv(envPlatformURL); u != "" {
		return runner.RedactURL(u)
	}
	return "http://127.0.0.1:8080"
}
