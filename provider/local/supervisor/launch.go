package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables that mark a process as a supervisor. They never
// reach a session's process.
const (
	EnvDir   = "MANAGOAT_LOCAL_SUPERVISOR"
	EnvStage = "MANAGOAT_LOCAL_SUPERVISOR_STAGE"
	// EnvHook, set to "main", says the supervisor's Backend can only be
	// built by the program's own main (a call to MaybeRun there); unset,
	// the package that launched it takes the role in its init function.
	EnvHook = "MANAGOAT_LOCAL_SUPERVISOR_HOOK"
)

// LaunchTimeout bounds how long Launch waits for a supervisor to be ready.
const LaunchTimeout = 30 * time.Second

// Launch makes sure a supervisor serves the sandbox directory dir: if none
// answers, it re-executes this binary (/proc/<pid>/exe, so a binary that was
// replaced or deleted since it started still works) as one, detached in
// its own session, and returns once it accepts connections. env is added
// to the supervisor's environment (EnvHook, say). The binary must take the
// role before it does anything else: provider/local does in its init.
func Launch(ctx context.Context, dir string, env ...string) error {
	c := Client{Dir: dir}
	if _, err := c.Ping(ctx); err == nil {
		return nil
	}
	// This process's own executable, even if its file was replaced since
	// (an upgrade, or go run's temporary binary); it stays valid while we
	// wait for the answer below.
	exe := fmt.Sprintf("/proc/%d/exe", os.Getpid())
	if _, err := os.Stat(exe); err != nil {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("supervisor: %w", err)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	// The supervisor must not be our child (it would become our zombie
	// when it exits): setsid -f (util-linux) forks, starts it in a new
	// session and exits at once. Without setsid, stage 1 of this binary
	// does the same, a few milliseconds slower.
	var cmd *exec.Cmd
	if setsid, err := exec.LookPath("setsid"); err == nil {
		logf, err := os.OpenFile(filepath.Join(dir, LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			w.Close()
			return fmt.Errorf("supervisor: %w", err)
		}
		defer logf.Close()
		// The trailing words are ignored by the supervisor (it reads its
		// role from the environment); they name it in ps and pkill.
		cmd = exec.Command(setsid, "-f", exe, ProcessTitle, dir)
		cmd.Env = append(append(filterEnv(os.Environ()), env...), EnvDir+"="+dir, EnvStage+"=2")
		cmd.Stdout, cmd.Stderr = logf, logf
	} else {
		cmd = exec.Command(exe, ProcessTitle, dir)
		cmd.Env = append(append(filterEnv(os.Environ()), env...), EnvDir+"="+dir, EnvStage+"=1")
	}
	cmd.ExtraFiles = []*os.File{w}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("supervisor: start: %w", err)
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("supervisor: launcher: %w", err)
	}
	deadline := time.Now().Add(LaunchTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = r.SetReadDeadline(deadline)
	line, err := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		return nil
	case line == "busy":
		// Another supervisor is starting: wait until it answers.
		for time.Now().Before(deadline) {
			if _, err := c.Ping(ctx); err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(10 * time.Millisecond)
		}
		return errors.New("supervisor: another supervisor holds the sandbox but does not answer")
	case strings.HasPrefix(line, "err "):
		return &StartError{Msg: strings.TrimPrefix(line, "err ")}
	}
	if err != nil {
		return fmt.Errorf("supervisor: no answer from the started supervisor (see %s): %w", filepath.Join(dir, LogName), err)
	}
	return fmt.Errorf("supervisor: unexpected answer %q", line)
}

// StartError is the reason a started supervisor gave for not serving.
type StartError struct{ Msg string }

func (e *StartError) Error() string { return "supervisor: start: " + e.Msg }

func filterEnv(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if strings.HasPrefix(e, EnvDir+"=") || strings.HasPrefix(e, EnvStage+"=") || strings.HasPrefix(e, EnvHook+"=") {
			continue
		}
		out = append(out, e)
	}
	return out
}

// IsSupervisor reports whether this process was started as a supervisor.
func IsSupervisor() bool { return os.Getenv(EnvStage) != "" }

// HookNeeded reports whether this process was started as a supervisor
// whose Backend only the program's main can build (EnvHook=main).
func HookNeeded() bool { return IsSupervisor() && os.Getenv(EnvHook) == "main" }

// ForgotHook ends a process started as a supervisor whose main did not
// take the role (hook names the call it should have made first): it says
// so on the launcher's ready pipe, so that the Create that launched it
// fails at once with that line, and on stderr (the supervisor's log), and
// exits. It never returns.
func ForgotHook(hook string) {
	msg := fmt.Sprintf("this process was started as a local sandbox's supervisor, but its main did not call %s first: call it first thing in main (and in TestMain), before anything else runs", hook)
	if os.Getenv(EnvStage) == "2" {
		if f := os.NewFile(3, "ready"); f != nil {
			fmt.Fprintln(f, "err "+msg)
		}
	}
	fmt.Fprintln(os.Stderr, "managoat: "+msg)
	os.Exit(2)
}

// MaybeRun runs the supervisor role when this process was started as one
// (by Launch), and then exits the process; otherwise it returns at once.
// build makes the Backend of the sandbox whose directory is given.
func MaybeRun(build func(dir string) (Backend, error)) {
	stage := os.Getenv(EnvStage)
	if stage == "" {
		return
	}
	dir := os.Getenv(EnvDir)
	os.Unsetenv(EnvStage)
	os.Unsetenv(EnvDir)
	if stage != "1" { // stage 1 passes it on to stage 2
		os.Unsetenv(EnvHook)
	}
	ready := os.NewFile(3, "ready")
	answer := func(s string) {
		if ready != nil {
			fmt.Fprintln(ready, s)
			ready.Close()
			ready = nil
		}
	}
	switch stage {
	case "1":
		os.Exit(stage1(dir, answer))
	case "2":
		unix.CloseOnExec(3)
		os.Exit(stage2(dir, build, answer))
	}
	answer("err unknown supervisor stage " + stage)
	os.Exit(2)
}

// ProcessTitle is the supervisor's first argument, so that ps shows
// "<exe> managoat-supervisor <sandbox dir>" and `pkill -f managoat`
// reaches it like every other managoat process.
const ProcessTitle = "managoat-supervisor"

func stage1(dir string, answer func(string)) int {
	exe := "/proc/self/exe"
	logf, err := os.OpenFile(filepath.Join(dir, LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		answer("err " + err.Error())
		return 1
	}
	defer logf.Close()
	cmd := exec.Command(exe, ProcessTitle, dir)
	cmd.Env = append(filterEnv(os.Environ()), EnvDir+"="+dir, EnvStage+"=2")
	if h := os.Getenv(EnvHook); h != "" {
		cmd.Env = append(cmd.Env, EnvHook+"="+h)
	}
	cmd.ExtraFiles = []*os.File{os.NewFile(3, "ready")}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		answer("err " + err.Error())
		return 1
	}
	_ = cmd.Process.Release()
	return 0
}

func stage2(dir string, build func(string) (Backend, error), answer func(string)) int {
	// SIGHUP and SIGINT are caught and dropped, never ignored: an ignored
	// signal would be inherited by every session's process (a shell there
	// could not be interrupted). SIGPIPE keeps Go's default (EPIPE).
	drop := make(chan os.Signal, 8)
	signal.Notify(drop, syscall.SIGHUP, syscall.SIGINT)
	go func() {
		for range drop {
		}
	}()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	b, err := build(dir)
	if err != nil {
		answer("err " + oneLine(err.Error()))
		return 1
	}
	// Warnings go to stderr, which is the sandbox's sup.log.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = Serve(ctx, Config{Dir: dir, Backend: b, Logger: logger, Ready: func(err error) {
		switch {
		case err == nil:
			answer("ok")
		case errors.Is(err, ErrBusy):
			answer("busy")
		default:
			answer("err " + oneLine(err.Error()))
		}
	}})
	if err != nil && !errors.Is(err, ErrBusy) {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		return 1
	}
	return 0
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
