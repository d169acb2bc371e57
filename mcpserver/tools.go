package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"maps"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/sandbox"
)

// The tools' names.
const (
	ToolCreate      = "sandbox_create"
	ToolDestroy     = "sandbox_destroy"
	ToolList        = "sandbox_list"
	ToolRun         = "run"
	ToolSessionRead = "session_read"
	ToolSessionKill = "session_kill"
	ToolFileRead    = "file_read"
	ToolFileWrite   = "file_write"
	ToolFileList    = "file_list"
	ToolFileDelete  = "file_delete"
	ToolPortPublish = "port_publish"
)

func (s *Server) addTools() {
	addTool(s, ToolCreate, "Create a sandbox (an isolated machine: never this host) and return its name. Optional: image (an OCI reference), limits, network (egress or none), allow (the egress allow list: domains, *.domain, addresses or CIDRs, each with an optional :PORT; [] denies all), labels, env, cwd, publish (ports to reach with port_publish). It is destroyed when this session ends.", createTool)
	addTool(s, ToolDestroy, "Destroy one of this session's sandboxes.", destroyTool)
	addTool(s, ToolList, "List the sandboxes this session made, with their status.", listTool)
	addTool(s, ToolRun, "Run a command in a sandbox: argv (a program and its arguments) or shell (a line for sh -c), with optional cwd, env, stdin and timeout_seconds (default 60, at most 3600). Returns exit_code, stdout and stderr (each cut at max_output_bytes, default 64 KiB, at most 1 MiB; truncated says so and *_bytes count all). Output streams as progress notifications when the call has a progress token. With detach it starts the command in a session and returns its session_id at once: follow it with session_read, end it with session_kill.", runTool)
	addTool(s, ToolSessionRead, "Read a detached run's output from byte offset (stdout and stderr in the order they came; next_offset is where to go on), waiting up to wait_seconds (at most 60) for more; exited and exit_code tell when it ended.", sessionReadTool)
	addTool(s, ToolSessionKill, "End a detached run's session (SIGTERM, then SIGKILL after grace; force: SIGKILL at once).", sessionKillTool)
	addTool(s, ToolFileRead, "Read a file of a sandbox: encoding text (UTF-8) or base64 (any bytes); from offset, at most max_bytes (default 1 MiB, at most 4 MiB); truncated says there is more.", fileReadTool)
	addTool(s, ToolFileWrite, "Write a file in a sandbox (replacing it, parents made): content as text, or base64 with encoding base64; at most 4 MiB; mode as octal, e.g. \"0755\".", fileWriteTool)
	addTool(s, ToolFileList, "List a directory of a sandbox: each entry's name, type (file, dir, symlink, other) and size.", fileListTool)
	addTool(s, ToolFileDelete, "Delete a file, or with recursive a directory and everything in it, in a sandbox.", fileDeleteTool)
	addTool(s, ToolPortPublish, "Return the URL of a port a sandbox publishes (give it in sandbox_create's publish): a preview URL a browser opens where the provider makes them, else its proxied or loopback URL.", portPublishTool)
}

// ---- sandbox_create, sandbox_destroy, sandbox_list

// LimitsInput are a sandbox's resource limits; zero or absent is none.
type LimitsInput struct {
	MemoryBytes      int64   `json:"memory_bytes,omitempty" jsonschema:"memory limit in bytes"`
	Pids             int     `json:"pids,omitempty" jsonschema:"most processes at once"`
	CPUMillis        int     `json:"cpu_millis,omitempty" jsonschema:"CPU share, 1000 is one core"`
	DiskBytes        int64   `json:"disk_bytes,omitempty" jsonschema:"disk quota of the sandbox's home in bytes"`
	WallClockSeconds float64 `json:"wall_clock_seconds,omitempty" jsonschema:"budget of each command, in seconds"`
}

// CreateInput is sandbox_create's input.
type CreateInput struct {
	Image   string            `json:"image,omitempty" jsonschema:"an OCI image reference (e.g. debian:12); empty: the host's runtime, read-only"`
	Limits  *LimitsInput      `json:"limits,omitempty" jsonschema:"resource limits"`
	Network string            `json:"network,omitempty" jsonschema:"egress (the default: the outside world, under allow) or none (loopback only)"`
	Allow   *[]string         `json:"allow,omitempty" jsonschema:"the egress allow list: example.com, *.example.com, 10.0.0.0/8 or an address, each optionally :PORT; [] denies all egress; absent: the provider's default"`
	Labels  map[string]string `json:"labels,omitempty" jsonschema:"labels kept with the sandbox (keys of letters, digits, . _ - /; not managoat.*)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment of every command run in it"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory of every command run in it"`
	Publish []int             `json:"publish,omitempty" jsonschema:"ports inside the sandbox to publish (port_publish gives their URL)"`
}

// SandboxOutput describes one sandbox.
type SandboxOutput struct {
	Name     string            `json:"name" jsonschema:"the sandbox's name: give it to every other tool"`
	Provider string            `json:"provider"`
	Status   string            `json:"status,omitempty" jsonschema:"running, suspended or unknown"`
	Labels   map[string]string `json:"labels,omitempty"`
	Publish  []int             `json:"publish,omitempty"`
	Created  time.Time         `json:"created"`
}

var labelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

func (in CreateInput) options(k Keeps, provider string) (sandbox.CreateOptions, error) {
	var o sandbox.CreateOptions
	drop := func(what string) error {
		return refuse(KindNotSupported, what, "provider %s keeps no %s; leave %s out", provider, what, what)
	}
	if in.Limits != nil {
		l := in.Limits
		if l.WallClockSeconds < 0 || l.WallClockSeconds > MaxTimeout.Seconds()*24 || math.IsNaN(l.WallClockSeconds) {
			return o, refuse(KindInvalid, "limits", "limits.wall_clock_seconds must be 0 to %d", int(MaxTimeout.Seconds()*24))
		}
		o.Limits = sandbox.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUMillis: l.CPUMillis, DiskBytes: l.DiskBytes,
			WallClock: time.Duration(l.WallClockSeconds * float64(time.Second))}
		if err := o.Limits.Validate(); err != nil {
			return o, refuse(KindInvalid, "limits", "a limit is negative")
		}
	}
	if in.Image != "" {
		if !k.Image {
			return o, drop("image")
		}
		if len(in.Image) > 512 || strings.ContainsAny(in.Image, " \t\n\x00") {
			return o, refuse(KindInvalid, "image", "image %q is not an image reference", clip(in.Image, 80))
		}
		o.Image = in.Image
	}
	switch in.Network {
	case "":
	case sandbox.NetworkEgress, sandbox.NetworkNone:
		if !k.Network {
			return o, drop("network")
		}
		o.Network = in.Network
	default:
		return o, refuse(KindInvalid, "network", "network is egress or none, not %q", clip(in.Network, 40))
	}
	if in.Allow != nil {
		if len(*in.Allow) > 256 {
			return o, refuse(KindLimit, "allow", "allow has %d entries, more than 256", len(*in.Allow))
		}
		for _, e := range *in.Allow {
			if err := sandbox.CheckAllowEntry(e); err != nil {
				return o, toolError(err, "")
			}
		}
	}
	if len(in.Labels) > 0 {
		if !k.Labels {
			return o, drop("labels")
		}
		if len(in.Labels) > 32 {
			return o, refuse(KindLimit, "labels", "%d labels, more than 32", len(in.Labels))
		}
		for key, v := range in.Labels {
			if !labelKey.MatchString(key) || strings.HasPrefix(key, "managoat.") {
				return o, refuse(KindInvalid, "labels", "label key %q: letters, digits, . _ - / (at most 63), and not managoat.*", clip(key, 70))
			}
			if len(v) > 256 || strings.ContainsAny(v, "\n\x00") {
				return o, refuse(KindInvalid, "labels", "label %s's value: at most 256 bytes, one line", key)
			}
		}
	}
	if len(in.Env) > 0 || in.Cwd != "" {
		if !k.Env {
			return o, drop("env")
		}
		env, err := envOf(in.Env)
		if err != nil {
			return o, err
		}
		o.Env = env
		if in.Cwd != "" {
			if err := checkPath(in.Cwd, "cwd"); err != nil {
				return o, err
			}
			o.Dir = in.Cwd
		}
	}
	if len(in.Publish) > 0 {
		if !k.Publish {
			return o, drop("publish")
		}
		if len(in.Publish) > 16 {
			return o, refuse(KindLimit, "publish", "%d ports, more than 16", len(in.Publish))
		}
		for _, p := range in.Publish {
			if p < 1 || p > 65535 {
				return o, refuse(KindInvalid, "publish", "port %d is not 1 to 65535", p)
			}
		}
		o.Publish = in.Publish
	}
	return o, nil
}

func envOf(m map[string]string) ([]string, error) {
	if len(m) > 256 {
		return nil, refuse(KindLimit, "env", "%d variables, more than 256", len(m))
	}
	env := make([]string, 0, len(m))
	for k, v := range m {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, refuse(KindInvalid, "env", "env %q: a name without = or NUL, a value without NUL", clip(k, 60))
		}
		env = append(env, k+"="+v)
	}
	return env, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkPath refuses a path no sandbox has: empty, with NUL, or over 4096 bytes.
func checkPath(p, field string) error {
	switch {
	case p == "":
		return refuse(KindInvalid, "path", "%s is empty", field)
	case strings.IndexByte(p, 0) >= 0:
		return refuse(KindInvalid, "path", "%s holds a NUL byte", field)
	case len(p) > 4096:
		return refuse(KindInvalid, "path", "%s is %d bytes, more than 4096", field, len(p))
	case !utf8.ValidString(p):
		return refuse(KindInvalid, "path", "%s is not UTF-8", field)
	}
	return nil
}

func createTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in CreateInput) (SandboxOutput, error) {
	opts, err := in.options(st.keeps, st.b.Provider)
	if err != nil {
		return SandboxOutput{}, err
	}
	st.mu.Lock()
	n := len(st.sandboxes)
	st.mu.Unlock()
	if n >= MaxSandboxesPerSession {
		return SandboxOutput{}, refuse(KindLimit, "sandboxes", "this session holds %d sandboxes, the most it may: destroy one with sandbox_destroy first", n)
	}
	name := NamePrefix + st.tag + "-" + newTag()[:4]
	labels := map[string]string{}
	if st.keeps.Labels {
		maps.Copy(labels, in.Labels)
		maps.Copy(labels, st.b.Labels)
		labels[LabelSession] = st.tag
		opts.Labels = labels
	}
	reg := st.b.Registry
	// Create adopts a sandbox of the name: make sure none is there, so
	// the end of the session never destroys a sandbox it did not make.
	h0 := sandbox.BuildHandle(st.b.Provider, name)
	if _, err := reg.Get(ctx, h0); !errors.Is(err, sandbox.ErrNotFound) {
		if err == nil {
			err = sandbox.ErrAlreadyExists
		}
		return SandboxOutput{}, toolError(err, "create "+name)
	}
	h, err := reg.Create(ctx, st.b.Provider, name, opts)
	if err != nil {
		// A create cut short may have made it: destroy what is there.
		_ = reg.Destroy(context.WithoutCancel(ctx), h0)
		return SandboxOutput{}, toolError(err, "create")
	}
	b := &box{h: h, labels: labels, publish: opts.Publish, created: time.Now().UTC()}
	st.mu.Lock()
	ended := st.ended
	if !ended {
		st.sandboxes[name] = b
		st.order = append(st.order, name)
	}
	st.mu.Unlock()
	if ended {
		_ = reg.Destroy(context.WithoutCancel(ctx), h)
		return SandboxOutput{}, refuse(KindUnavailable, "session_ended", "the session ended while the sandbox was made; it was destroyed")
	}
	if in.Allow != nil {
		if err := reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: *in.Allow}); err != nil {
			_ = st.destroy(name)
			return SandboxOutput{}, toolError(err, "apply the allow list (the sandbox was destroyed)")
		}
	}
	out := SandboxOutput{Name: name, Provider: st.b.Provider, Status: string(sandbox.StatusRunning), Publish: b.publish, Created: b.created}
	if len(labels) > 0 {
		out.Labels = labels
	}
	return out, nil
}

// SandboxInput names a sandbox.
type SandboxInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name, as sandbox_create returned it"`
}

// DestroyOutput is sandbox_destroy's result.
type DestroyOutput struct {
	Destroyed string `json:"destroyed"`
}

func destroyTool(_ context.Context, _ *mcp.CallToolRequest, st *session, in SandboxInput) (DestroyOutput, error) {
	if _, err := st.box(in.Sandbox); err != nil {
		return DestroyOutput{}, err
	}
	if err := st.destroy(in.Sandbox); err != nil {
		return DestroyOutput{}, toolError(err, "destroy")
	}
	return DestroyOutput{Destroyed: in.Sandbox}, nil
}

// ListInput is sandbox_list's (empty) input.
type ListInput struct{}

// ListOutput is sandbox_list's result.
type ListOutput struct {
	Sandboxes []SandboxOutput `json:"sandboxes"`
}

func listTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, _ ListInput) (ListOutput, error) {
	st.mu.Lock()
	boxes := make([]*box, 0, len(st.order))
	for _, n := range st.order {
		boxes = append(boxes, st.sandboxes[n])
	}
	st.mu.Unlock()
	out := ListOutput{Sandboxes: []SandboxOutput{}}
	for _, b := range boxes {
		status := string(sandbox.StatusUnknown)
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := st.b.Registry.Get(gctx, b.h)
		cancel()
		switch {
		case err == nil:
			status = string(info.Status)
		case errors.Is(err, sandbox.ErrNotFound):
			status = "gone"
		}
		o := SandboxOutput{Name: b.h.Name, Provider: st.b.Provider, Status: status, Publish: b.publish, Created: b.created}
		if len(b.labels) > 0 {
			o.Labels = b.labels
		}
		out.Sandboxes = append(out.Sandboxes, o)
	}
	return out, nil
}

// ---- run, session_read, session_kill

// RunInput is run's input.
type RunInput struct {
	Sandbox        string            `json:"sandbox" jsonschema:"the sandbox's name"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"the program and its arguments (give argv or shell)"`
	Shell          string            `json:"shell,omitempty" jsonschema:"a command line run as sh -c LINE (give argv or shell)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text written to the command's stdin, which is then closed"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"budget in seconds (default 60, at most 3600); the command is killed when it runs out"`
	MaxOutputBytes int               `json:"max_output_bytes,omitempty" jsonschema:"bytes kept of stdout and of stderr each (default 65536, at most 1048576)"`
	Detach         bool              `json:"detach,omitempty" jsonschema:"start it in a session and return its session_id at once"`
}

// RunOutput is run's result.
type RunOutput struct {
	ExitCode    *int   `json:"exit_code,omitempty" jsonschema:"the command's exit code (absent for a detached start)"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes" jsonschema:"bytes the command wrote to stdout, kept or not"`
	StderrBytes int64  `json:"stderr_bytes"`
	Truncated   bool   `json:"truncated" jsonschema:"stdout or stderr was cut at max_output_bytes"`
	SessionID   string `json:"session_id,omitempty" jsonschema:"a detached run's session, for session_read and session_kill"`
	DurationMS  int64  `json:"duration_ms"`
}

func (in RunInput) cmd() (sandbox.Cmd, error) {
	switch {
	case len(in.Argv) > 0 && in.Shell != "":
		return sandbox.Cmd{}, refuse(KindInvalid, "command", "give argv or shell, not both")
	case in.Shell != "":
		if strings.IndexByte(in.Shell, 0) >= 0 {
			return sandbox.Cmd{}, refuse(KindInvalid, "command", "shell holds a NUL byte")
		}
		return sandbox.Cmd{Name: "sh", Args: []string{"-c", in.Shell}}, nil
	case len(in.Argv) == 0 || in.Argv[0] == "":
		return sandbox.Cmd{}, refuse(KindInvalid, "command", "give argv (a program and its arguments) or shell (a line for sh -c)")
	}
	for _, a := range in.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return sandbox.Cmd{}, refuse(KindInvalid, "command", "an argument holds a NUL byte")
		}
	}
	return sandbox.Cmd{Name: in.Argv[0], Args: in.Argv[1:]}, nil
}

// capBuf keeps the first max bytes written and counts them all.
type capBuf struct {
	b     []byte
	max   int
	total int64
}

func (c *capBuf) write(p []byte) {
	c.total += int64(len(p))
	if room := c.max - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(room, len(p))]...)
	}
}

func (c *capBuf) truncated() bool { return c.total > int64(len(c.b)) }

func runTool(ctx context.Context, req *mcp.CallToolRequest, st *session, in RunInput) (RunOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return RunOutput{}, err
	}
	c, err := in.cmd()
	if err != nil {
		return RunOutput{}, err
	}
	env, err := envOf(in.Env)
	if err != nil {
		return RunOutput{}, err
	}
	if in.Cwd != "" {
		if err := checkPath(in.Cwd, "cwd"); err != nil {
			return RunOutput{}, err
		}
	}
	timeout := DefaultTimeout
	switch {
	case in.TimeoutSeconds < 0 || in.TimeoutSeconds > MaxTimeout.Seconds() || math.IsNaN(in.TimeoutSeconds):
		return RunOutput{}, refuse(KindInvalid, "timeout", "timeout_seconds must be 0 to %d (run longer commands with detach)", int(MaxTimeout.Seconds()))
	case in.TimeoutSeconds > 0:
		timeout = time.Duration(in.TimeoutSeconds * float64(time.Second))
	}
	maxOut := DefaultOutputBytes
	switch {
	case in.MaxOutputBytes < 0 || in.MaxOutputBytes > MaxOutputBytes:
		return RunOutput{}, refuse(KindLimit, "max_output_bytes", "max_output_bytes must be 0 to %d", MaxOutputBytes)
	case in.MaxOutputBytes > 0:
		maxOut = in.MaxOutputBytes
	}
	reg := st.b.Registry
	start := time.Now()
	if in.Detach {
		caps, err := reg.CapabilitiesOf(ctx, b.h)
		if err != nil {
			return RunOutput{}, toolError(err, "run")
		}
		if !caps.Has(sandbox.CapAttach) {
			return RunOutput{}, refuse(KindNotSupported, "attach", "provider %s has no detachable sessions: run it without detach", st.b.Provider)
		}
		cmd, err := reg.Spawn(ctx, b.h, c, sandbox.SpawnOptions{Env: env, Dir: in.Cwd, Detachable: true, Stdin: in.Stdin != ""})
		if err != nil {
			return RunOutput{}, toolError(err, "run")
		}
		defer cmd.Stop()
		if in.Stdin != "" {
			if err := feedStdin(ctx, cmd, in.Stdin); err != nil {
				return RunOutput{}, toolError(err, "stdin")
			}
		}
		if cmd.SessionID == "" {
			return RunOutput{}, refuse(KindNotSupported, "attach", "provider %s gave the run no session id", st.b.Provider)
		}
		st.mu.Lock()
		if len(b.sessions) < 256 {
			b.sessions = append(b.sessions, cmd.SessionID)
		}
		st.mu.Unlock()
		return RunOutput{SessionID: cmd.SessionID, DurationMS: time.Since(start).Milliseconds()}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd, err := reg.Spawn(rctx, b.h, c, sandbox.SpawnOptions{Env: env, Dir: in.Cwd, Stdin: in.Stdin != ""})
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			err = sandbox.ExecTimeout(timeout)
		}
		return RunOutput{}, toolError(err, "run")
	}
	// The providers' producers wait for room (Stream.WaitRoom): a
	// smaller bound than the contract's makes the command wait, never
	// this server hold its output.
	cmd.Stream().SetLimit(streamQueue)
	kill := func() {
		_ = cmd.Stop()
		if cmd.SessionID != "" {
			tctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			_ = reg.TerminateSession(tctx, b.h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force})
			cancel()
		}
	}
	if in.Stdin != "" {
		go func() { _ = feedStdin(rctx, cmd, in.Stdin) }()
	}
	out, errb := &capBuf{max: maxOut}, &capBuf{max: maxOut}
	prog := newProgress(ctx, req)
	defer prog.stop()
	code, runErr := -1, error(nil)
loop:
	for {
		select {
		case <-rctx.Done():
			kill()
			if ctx.Err() != nil {
				runErr = ctx.Err()
			} else {
				runErr = sandbox.ExecTimeout(timeout)
			}
			break loop
		case ev, ok := <-cmd.Events():
			if !ok {
				runErr = sandbox.ClosedBeforeExit()
				break loop
			}
			switch ev.Kind {
			case sandbox.Stdout:
				out.write(ev.Data)
				prog.add(ev.Data)
			case sandbox.Stderr:
				errb.write(ev.Data)
				prog.add(ev.Data)
			case sandbox.Exit:
				code = ev.Code
				break loop
			case sandbox.Error:
				runErr = ev.Err
				break loop
			}
		}
	}
	prog.stop()
	if runErr != nil {
		te := toolError(runErr, "run")
		if te.Kind == KindTimeout {
			te.Stdout, te.Stderr = tailText(out.b, 4096), tailText(errb.b, 4096)
		}
		return RunOutput{}, te
	}
	return RunOutput{ExitCode: &code, Stdout: string(out.b), Stderr: string(errb.b), StdoutBytes: out.total, StderrBytes: errb.total,
		Truncated: out.truncated() || errb.truncated(), DurationMS: time.Since(start).Milliseconds()}, nil
}

func tailText(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func feedStdin(ctx context.Context, cmd *sandbox.Command, data string) error {
	if err := cmd.WriteStdin(ctx, []byte(data)); err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
		return err
	}
	if err := cmd.CloseStdin(ctx); err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
		return err
	}
	return nil
}

// SessionReadInput is session_read's input.
type SessionReadInput struct {
	Sandbox     string  `json:"sandbox" jsonschema:"the sandbox's name"`
	SessionID   string  `json:"session_id" jsonschema:"the session_id run returned"`
	Offset      int64   `json:"offset,omitempty" jsonschema:"byte offset to read from (0: the start; next_offset of the last read to go on)"`
	MaxBytes    int     `json:"max_bytes,omitempty" jsonschema:"bytes to return at most (default 65536, at most 1048576)"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"how long to wait for output or the end (default 0: what is there now; at most 60)"`
}

// SessionReadOutput is session_read's result.
type SessionReadOutput struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	NextOffset int64  `json:"next_offset" jsonschema:"the offset after what was returned"`
	Exited     bool   `json:"exited" jsonschema:"the command has ended and everything up to next_offset is all it wrote"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	More       bool   `json:"more" jsonschema:"there is output past next_offset already"`
}

func (st *session) detached(in string, sid string) (*box, error) {
	b, err := st.box(in)
	if err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sid); err != nil {
		return nil, toolError(err, "")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, s := range b.sessions {
		if s == sid {
			return b, nil
		}
	}
	return nil, refuse(KindNotFound, "session", "session %q is not a detached run of this session's in %s (run with detach starts one)", clip(sid, 80), in)
}

func sessionReadTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in SessionReadInput) (SessionReadOutput, error) {
	b, err := st.detached(in.Sandbox, in.SessionID)
	if err != nil {
		return SessionReadOutput{}, err
	}
	max := DefaultOutputBytes
	switch {
	case in.MaxBytes < 0 || in.MaxBytes > MaxOutputBytes:
		return SessionReadOutput{}, refuse(KindLimit, "max_bytes", "max_bytes must be 0 to %d", MaxOutputBytes)
	case in.MaxBytes > 0:
		max = in.MaxBytes
	}
	if in.Offset < 0 {
		return SessionReadOutput{}, refuse(KindInvalid, "offset", "offset must not be negative")
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > 60 || math.IsNaN(in.WaitSeconds) {
		return SessionReadOutput{}, refuse(KindInvalid, "wait_seconds", "wait_seconds must be 0 to 60")
	}
	cmd, err := st.b.Registry.Attach(ctx, b.h, in.SessionID, sandbox.AttachOptions{})
	if err != nil {
		return SessionReadOutput{}, toolError(err, "attach")
	}
	defer cmd.Stop()
	cmd.Stream().SetLimit(streamQueue)
	// The replay comes at once; a quiet spell after it is "nothing
	// more now" (or the wait's end, when one was asked).
	quiet := 250 * time.Millisecond
	deadline := time.NewTimer(time.Duration(in.WaitSeconds*float64(time.Second)) + quiet)
	defer deadline.Stop()
	idle := time.NewTimer(quiet)
	defer idle.Stop()
	var out SessionReadOutput
	var stdout, stderr []byte
	pos, taken := int64(0), 0
	for {
		select {
		case <-ctx.Done():
			return SessionReadOutput{}, toolError(ctx.Err(), "session_read")
		case <-deadline.C:
			goto done
		case <-idle.C:
			if in.WaitSeconds == 0 || taken > 0 {
				goto done
			}
		case ev, ok := <-cmd.Events():
			if !ok {
				goto done
			}
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
				d := ev.Data
				if skip := in.Offset - pos; skip > 0 {
					pos += min(skip, int64(len(d)))
					d = d[min(skip, int64(len(d))):]
				}
				if room := max - taken; len(d) > room {
					out.More = true
					d = d[:room]
				}
				if ev.Kind == sandbox.Stdout {
					stdout = append(stdout, d...)
				} else {
					stderr = append(stderr, d...)
				}
				taken += len(d)
				pos += int64(len(d))
				if out.More {
					goto done
				}
				idle.Reset(quiet)
			case sandbox.Exit:
				code := ev.Code
				out.Exited, out.ExitCode = true, &code
				goto done
			case sandbox.Error:
				return SessionReadOutput{}, toolError(ev.Err, "session_read")
			}
		}
	}
done:
	if pos < in.Offset && out.Exited {
		pos = in.Offset
	}
	out.Stdout, out.Stderr, out.NextOffset = string(stdout), string(stderr), max64(pos, in.Offset)
	if out.More {
		out.Exited, out.ExitCode = false, nil
	}
	return out, nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// SessionKillInput is session_kill's input.
type SessionKillInput struct {
	Sandbox   string `json:"sandbox" jsonschema:"the sandbox's name"`
	SessionID string `json:"session_id" jsonschema:"the session_id run returned"`
	Force     bool   `json:"force,omitempty" jsonschema:"SIGKILL at once"`
}

// SessionKillOutput is session_kill's result.
type SessionKillOutput struct {
	Terminated string `json:"terminated"`
}

func sessionKillTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in SessionKillInput) (SessionKillOutput, error) {
	b, err := st.detached(in.Sandbox, in.SessionID)
	if err != nil {
		return SessionKillOutput{}, err
	}
	o := sandbox.TerminateOptions{Mode: sandbox.Graceful}
	if in.Force {
		o.Mode = sandbox.Force
	}
	if err := st.b.Registry.TerminateSession(ctx, b.h, in.SessionID, o); err != nil {
		return SessionKillOutput{}, toolError(err, "session_kill")
	}
	return SessionKillOutput{Terminated: in.SessionID}, nil
}

// ---- files

// FileReadInput is file_read's input.
type FileReadInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path     string `json:"path" jsonschema:"the file's path in the sandbox (relative: to its home)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (the default: UTF-8) or base64"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"byte offset to read from"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"bytes to read at most (default 1048576, at most 4194304)"`
}

// FileReadOutput is file_read's result.
type FileReadOutput struct {
	Path      string `json:"path"`
	Size      int64  `json:"size" jsonschema:"the file's size in bytes"`
	Encoding  string `json:"encoding"`
	Content   string `json:"content"`
	Bytes     int    `json:"bytes" jsonschema:"bytes in content (decoded)"`
	Truncated bool   `json:"truncated" jsonschema:"the file goes on past offset+bytes"`
}

func encodingOf(e string) (string, error) {
	switch e {
	case "", "text", "utf-8", "utf8":
		return "text", nil
	case "base64":
		return "base64", nil
	}
	return "", refuse(KindInvalid, "encoding", "encoding is text or base64, not %q", clip(e, 20))
}

func fileReadTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in FileReadInput) (FileReadOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return FileReadOutput{}, err
	}
	if err := checkPath(in.Path, "path"); err != nil {
		return FileReadOutput{}, err
	}
	enc, err := encodingOf(in.Encoding)
	if err != nil {
		return FileReadOutput{}, err
	}
	max := DefaultFileBytes
	switch {
	case in.MaxBytes < 0 || in.MaxBytes > MaxFileBytes:
		return FileReadOutput{}, refuse(KindLimit, "max_bytes", "max_bytes must be 0 to %d (read a larger file in parts, with offset)", MaxFileBytes)
	case in.MaxBytes > 0:
		max = in.MaxBytes
	}
	if in.Offset < 0 {
		return FileReadOutput{}, refuse(KindInvalid, "offset", "offset must not be negative")
	}
	rc, size, err := st.b.Registry.OpenFile(ctx, b.h, in.Path)
	if err != nil {
		return FileReadOutput{}, toolError(err, "read "+in.Path)
	}
	defer rc.Close()
	if in.Offset > 0 {
		if _, err := io.CopyN(io.Discard, rc, in.Offset); err != nil && !errors.Is(err, io.EOF) {
			return FileReadOutput{}, toolError(err, "read "+in.Path)
		}
	}
	data, err := io.ReadAll(io.LimitReader(rc, int64(max)+1))
	if err != nil {
		return FileReadOutput{}, toolError(err, "read "+in.Path)
	}
	out := FileReadOutput{Path: in.Path, Size: size, Encoding: enc}
	if len(data) > max {
		data, out.Truncated = data[:max], true
	}
	out.Bytes = len(data)
	if enc == "base64" {
		out.Content = base64.StdEncoding.EncodeToString(data)
		return out, nil
	}
	if !utf8.Valid(data) {
		// A cut may split a character: give back whole ones.
		if out.Truncated {
			for i := 1; i < utf8.UTFMax && len(data) > i; i++ {
				if utf8.Valid(data[:len(data)-i]) {
					data = data[:len(data)-i]
					out.Bytes = len(data)
					break
				}
			}
		}
		if !utf8.Valid(data) {
			return FileReadOutput{}, refuse(KindInvalid, "encoding", "%s is not UTF-8 text: read it with encoding base64", in.Path)
		}
	}
	out.Content = string(data)
	return out, nil
}

// FileWriteInput is file_write's input.
type FileWriteInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path     string `json:"path" jsonschema:"the file's path in the sandbox (relative: to its home)"`
	Content  string `json:"content" jsonschema:"the file's content: text, or base64 with encoding base64"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 0644 (the default) or 0755"`
}

// FileWriteOutput is file_write's result.
type FileWriteOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes" jsonschema:"bytes written"`
}

func fileWriteTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in FileWriteInput) (FileWriteOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return FileWriteOutput{}, err
	}
	if err := checkPath(in.Path, "path"); err != nil {
		return FileWriteOutput{}, err
	}
	enc, err := encodingOf(in.Encoding)
	if err != nil {
		return FileWriteOutput{}, err
	}
	data := []byte(in.Content)
	if enc == "base64" {
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return FileWriteOutput{}, refuse(KindInvalid, "content", "content is not base64: %v", err)
		}
	}
	if len(data) > MaxFileBytes {
		return FileWriteOutput{}, refuse(KindLimit, "content", "content is %d bytes, more than %d: write it in parts (run with shell 'cat >> FILE' and stdin)", len(data), MaxFileBytes)
	}
	o := sandbox.WriteFileOptions{Mode: 0o644}
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o777 {
			return FileWriteOutput{}, refuse(KindInvalid, "mode", "mode %q is not octal permission bits (0000 to 0777)", clip(in.Mode, 10))
		}
		o.Mode = fsMode(m)
	}
	if err := st.b.Registry.WriteFile(ctx, b.h, in.Path, data, o); err != nil {
		return FileWriteOutput{}, toolError(err, "write "+in.Path)
	}
	return FileWriteOutput{Path: in.Path, Bytes: len(data)}, nil
}

// FileListInput is file_list's input.
type FileListInput struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path       string `json:"path,omitempty" jsonschema:"the directory (default: the home)"`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"entries to return at most (default 1000, at most 5000)"`
}

// Entry is one entry of a directory.
type Entry struct {
	Name string `json:"name"`
	Type string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size *int64 `json:"size,omitempty" jsonschema:"bytes, where known"`
}

// FileListOutput is file_list's result.
type FileListOutput struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated" jsonschema:"there are more entries than max_entries"`
}

// listScript lists directory $1 as NUL-separated "TYPE SIZE NAME"
// records, through GNU find where the sandbox has it, else a POSIX loop
// (no sizes). Exit 20: not a directory; 21: not there.
const listScript = `d=$1
[ -e "$d" ] || [ -L "$d" ] || exit 21
[ -d "$d" ] || exit 20
if find "$d" -maxdepth 0 -printf '' 2>/dev/null; then
  exec find "$d" -mindepth 1 -maxdepth 1 -printf '%y %s %f\0'
fi
cd -- "$d" || exit 20
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ]; then t=l; elif [ -d "$f" ]; then t=d; elif [ -f "$f" ]; then t=f; else t=o; fi
  printf '%s - %s\0' "$t" "$f"
done`

func fileListTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in FileListInput) (FileListOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return FileListOutput{}, err
	}
	if in.Path == "" {
		in.Path = "."
	}
	if err := checkPath(in.Path, "path"); err != nil {
		return FileListOutput{}, err
	}
	max := 1000
	switch {
	case in.MaxEntries < 0 || in.MaxEntries > MaxListEntries:
		return FileListOutput{}, refuse(KindLimit, "max_entries", "max_entries must be 0 to %d", MaxListEntries)
	case in.MaxEntries > 0:
		max = in.MaxEntries
	}
	// A name is at most 255 bytes: the records of max entries fit in
	// this, and what is past it is read and dropped.
	limit := max*(255+24) + 1
	res, err := st.b.Registry.Exec(ctx, b.h, sandbox.Cmd{Name: "sh", Args: []string{"-c", listScript, "sh", in.Path}},
		sandbox.ExecOptions{Timeout: DefaultTimeout, MaxOutput: limit})
	if err != nil {
		return FileListOutput{}, toolError(err, "list "+in.Path)
	}
	switch res.ExitCode {
	case 0:
	case 20:
		return FileListOutput{}, refuse(KindInvalid, "path", "%s is not a directory (file_read reads a file)", in.Path)
	case 21:
		return FileListOutput{}, refuse(KindNotFound, "path", "%s does not exist in the sandbox", in.Path)
	default:
		return FileListOutput{}, refuse(KindInternal, "list", "listing %s exited %d", in.Path, res.ExitCode)
	}
	out := FileListOutput{Path: in.Path, Entries: []Entry{}}
	recs := strings.Split(string(res.Output), "\x00")
	if res.Truncated && len(recs) > 0 {
		recs = recs[:len(recs)-1] // the cut one
		out.Truncated = true
	}
	types := map[string]string{"f": "file", "d": "dir", "l": "symlink"}
	for _, r := range recs {
		t, rest, ok1 := strings.Cut(r, " ")
		sz, name, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 || name == "" {
			continue
		}
		if len(out.Entries) == max {
			out.Truncated = true
			break
		}
		e := Entry{Name: strings.ToValidUTF8(name, "\uFFFD"), Type: types[t]}
		if e.Type == "" {
			e.Type = "other"
		}
		if n, err := strconv.ParseInt(sz, 10, 64); err == nil && n >= 0 {
			e.Size = &n
		}
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}

// FileDeleteInput is file_delete's input.
type FileDeleteInput struct {
	Sandbox   string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path      string `json:"path" jsonschema:"the path to delete"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"delete a directory and everything in it"`
}

// FileDeleteOutput is file_delete's result.
type FileDeleteOutput struct {
	Deleted string `json:"deleted"`
}

const deleteScript = `p=$1
[ -e "$p" ] || [ -L "$p" ] || exit 21
if [ -d "$p" ] && [ ! -L "$p" ]; then
  if [ "$2" = r ]; then exec rm -rf -- "$p"; fi
  exec rmdir -- "$p" 2>/dev/null || exit 22
fi
exec rm -f -- "$p"`

func fileDeleteTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in FileDeleteInput) (FileDeleteOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return FileDeleteOutput{}, err
	}
	if err := checkPath(in.Path, "path"); err != nil {
		return FileDeleteOutput{}, err
	}
	if p := strings.TrimRight(in.Path, "/"); p == "" || p == "." || p == ".." {
		return FileDeleteOutput{}, refuse(KindInvalid, "path", "%q is not a path file_delete deletes (name what is in it)", in.Path)
	}
	r := "-"
	if in.Recursive {
		r = "r"
	}
	res, err := st.b.Registry.Exec(ctx, b.h, sandbox.Cmd{Name: "sh", Args: []string{"-c", deleteScript, "sh", in.Path, r}},
		sandbox.ExecOptions{Timeout: DefaultTimeout, StderrToStdout: true, MaxOutput: 4096})
	if err != nil {
		return FileDeleteOutput{}, toolError(err, "delete "+in.Path)
	}
	switch res.ExitCode {
	case 0:
		return FileDeleteOutput{Deleted: in.Path}, nil
	case 21:
		return FileDeleteOutput{}, refuse(KindNotFound, "path", "%s does not exist in the sandbox", in.Path)
	case 22:
		return FileDeleteOutput{}, refuse(KindInvalid, "path", "%s is a directory that is not empty: give recursive to delete it and what it holds", in.Path)
	}
	return FileDeleteOutput{}, refuse(KindInvalid, "delete", "deleting %s failed (exit %d): %s", in.Path, res.ExitCode, clip(strings.TrimSpace(string(res.Output)), 300))
}

// ---- port_publish

// PortInput is port_publish's input.
type PortInput struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox's name"`
	Port       int    `json:"port" jsonschema:"a port the sandbox publishes (sandbox_create's publish)"`
	TTLSeconds int    `json:"ttl_seconds,omitempty" jsonschema:"a preview URL's lifetime, where the provider makes previews"`
}

// PortOutput is port_publish's result.
type PortOutput struct {
	URL     string     `json:"url"`
	Port    int        `json:"port"`
	Kind    string     `json:"kind" jsonschema:"preview (a link a browser opens), or url (the provider's URL of the port)"`
	Expires *time.Time `json:"expires_at,omitempty"`
}

// Previewer is implemented by a provider that makes preview URLs of a
// sandbox's port (the platform, through its /v1 preview route).
type Previewer interface {
	PreviewURL(ctx context.Context, h *sandbox.Handle, port int, ttl time.Duration) (url string, expires time.Time, err error)
}

func portPublishTool(ctx context.Context, _ *mcp.CallToolRequest, st *session, in PortInput) (PortOutput, error) {
	b, err := st.box(in.Sandbox)
	if err != nil {
		return PortOutput{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return PortOutput{}, refuse(KindInvalid, "port", "port %d is not 1 to 65535", in.Port)
	}
	if in.TTLSeconds < 0 || in.TTLSeconds > 86400 {
		return PortOutput{}, refuse(KindInvalid, "ttl_seconds", "ttl_seconds must be 0 to 86400")
	}
	idx := -1
	for i, p := range b.publish {
		if p == in.Port {
			idx = i
		}
	}
	if idx < 0 {
		return PortOutput{}, refuse(KindInvalid, "port", "sandbox %s does not publish port %d (it publishes %v): ports are published when the sandbox is made (sandbox_create's publish)", in.Sandbox, in.Port, b.publish)
	}
	p, err := st.b.Registry.Provider(b.h.Provider)
	if err != nil {
		return PortOutput{}, toolError(err, "")
	}
	if pv, ok := p.(Previewer); ok {
		u, exp, err := pv.PreviewURL(ctx, b.h, in.Port, time.Duration(in.TTLSeconds)*time.Second)
		if err == nil {
			out := PortOutput{URL: u, Port: in.Port, Kind: "preview"}
			if !exp.IsZero() {
				out.Expires = &exp
			}
			return out, nil
		}
		if !errors.Is(err, sandbox.ErrNotSupported) {
			return PortOutput{}, toolError(err, "preview")
		}
	}
	if idx != 0 {
		return PortOutput{}, refuse(KindNotSupported, "port", "provider %s gives a URL for a sandbox's first published port (%d) only", st.b.Provider, b.publish[0])
	}
	u, err := st.b.Registry.PublicURL(ctx, b.h)
	if err != nil {
		return PortOutput{}, toolError(err, "url")
	}
	return PortOutput{URL: u, Port: in.Port, Kind: "url"}, nil
}
