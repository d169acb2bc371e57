package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Capability names one promise a provider makes about its answers. The set
// is closed: the conformance suite refuses any other name.
type Capability string

// The known capabilities.
const (
	CapSuspend               Capability = "suspend"                 // an idle sandbox can park with its disk kept
	CapNetworkPolicy         Capability = "network_policy"          // deny-capable egress policy; Allow: [] denies all
	CapCheckpoint            Capability = "checkpoint"              // checkpoint create/restore usable
	CapCreateCheckpointOnce  Capability = "create_checkpoint_once"  // bounded checkpoint creation keyed by an operation id
	CapAttach                Capability = "attach"                  // detachable sessions with replay from byte zero
	CapTTY                   Capability = "tty"                     // PTY allocation on spawn
	CapPublicURL             Capability = "public_url"              // an HTTP endpoint per sandbox
	CapTerminateSession      Capability = "terminate_session"       // provider-confirmed graceful termination
	CapForceTerminateSession Capability = "force_terminate_session" // TerminateOptions.Mode == Force understood
	CapCreateNew             Capability = "create_new"              // one creation attempt that never adopts
	CapDestroyOnce           Capability = "destroy_once"            // one bounded, confirmed deletion attempt
)

// KnownCapabilities lists every capability name, in the contract's order.
func KnownCapabilities() []Capability {
	return []Capability{CapSuspend, CapNetworkPolicy, CapCheckpoint, CapCreateCheckpointOnce,
		CapAttach, CapTTY, CapPublicURL, CapTerminateSession, CapForceTerminateSession,
		CapCreateNew, CapDestroyOnce}
}

// IsKnown reports whether c is one of the contract's capability names.
func (c Capability) IsKnown() bool { return slices.Contains(KnownCapabilities(), c) }

// Capabilities is a set of capability names, kept sorted and unique.
type Capabilities []Capability

// NewCapabilities returns the set of the given names.
func NewCapabilities(cs ...Capability) Capabilities {
	out := slices.Clone(cs)
	slices.Sort(out)
	return slices.Compact(out)
}

// Has reports whether c is in the set.
func (s Capabilities) Has(c Capability) bool { return slices.Contains(s, c) }

// With returns the set plus cs.
func (s Capabilities) With(cs ...Capability) Capabilities {
	return NewCapabilities(append(slices.Clone(s), cs...)...)
}

// Without returns the set minus cs.
func (s Capabilities) Without(cs ...Capability) Capabilities {
	return slices.DeleteFunc(slices.Clone(s), func(c Capability) bool { return slices.Contains(cs, c) })
}

func (s Capabilities) String() string {
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = string(c)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Handle refers to one sandbox. Name is its only durable identity; every
// operation works on a handle rebuilt from Provider and Name alone, with
// Private nil. Private holds adapter state (it may hold credentials) and is
// never printed: every fmt verb, JSON and slog show only Provider, Name and,
// in JSON, InstanceID.
type Handle struct {
	Provider string
	Name     string
	// InstanceID is the provider-issued identity of one incarnation, set
	// only by CreateNew. It is opaque, not an authorization token, and gives
	// no conditional-delete guarantee. Hosts persist it with their intent.
	InstanceID string
	// Private is adapter-owned. It is never printed or serialised.
	Private any
}

// BuildHandle returns a bare handle for name on provider; it does no I/O.
func BuildHandle(provider, name string) *Handle { return &Handle{Provider: provider, Name: name} }

// String shows only the provider and the name.
func (h *Handle) String() string {
	if h == nil {
		return "<nil handle>"
	}
	return h.Provider + "/" + h.Name
}

// Format makes every verb, %+v and %#v included, print String's form.
func (h *Handle) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", h.String())
		return
	}
	fmt.Fprint(f, "Handle{"+h.String()+"}")
}

// LogValue keeps Private out of slog output.
func (h *Handle) LogValue() slog.Value {
	if h == nil {
		return slog.StringValue("<nil>")
	}
	return slog.GroupValue(slog.String("provider", h.Provider), slog.String("name", h.Name))
}

type handleJSON struct {
	Provider   string `json:"provider"`
	Name       string `json:"name"`
	InstanceID string `json:"instance_id,omitempty"`
}

// MarshalJSON writes provider, name and instance_id; never Private.
func (h *Handle) MarshalJSON() ([]byte, error) {
	return json.Marshal(handleJSON{h.Provider, h.Name, h.InstanceID})
}

// UnmarshalJSON reads what MarshalJSON writes; Private stays nil.
func (h *Handle) UnmarshalJSON(b []byte) error {
	var j handleJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = Handle{Provider: j.Provider, Name: j.Name, InstanceID: j.InstanceID}
	return nil
}

// Cmd is a command line: a program name and its arguments (not including
// the name), like exec.Command's.
type Cmd struct {
	Name string
	Args []string
}

// String is the full command line joined by single spaces, as sessions
// report it.
func (c Cmd) String() string { return strings.Join(c.Argv(), " ") }

// Argv returns Name followed by Args.
func (c Cmd) Argv() []string { return append([]string{c.Name}, c.Args...) }

// Status is a sandbox's coarse state. The provider's own vocabulary is not
// part of the contract: anything unrecognised is StatusUnknown.
type Status string

// The statuses.
const (
	StatusRunning   Status = "running"
	StatusSuspended Status = "suspended"
	StatusUnknown   Status = "unknown"
)

// Info is what Get returns: a coarse status and the provider's own body,
// untouched.
type Info struct {
	Status Status
	Raw    json.RawMessage
}

// Session is a detachable session inside a sandbox. There is deliberately
// no "active" flag: a detached session looks inactive while nobody is
// connected, and filtering on it would skip the sessions attach exists for.
type Session struct {
	ID             string
	Command        string    // the full command line, or "" when unknown
	CreatedAt      time.Time // zero when unknown
	LastActivityAt time.Time // zero when unknown
	TTY            bool
	// State is SessionRunning or SessionExited, or "" when the provider
	// does not say (SessionLost: it ended with no exit status known).
	State string
	// ExitCode is an exited session's exit code (State SessionExited).
	ExitCode int
}

// The session states a provider may report in Session.State.
const (
	SessionRunning = "running"
	SessionExited  = "exited"
	SessionLost    = "lost"
)

// NetworkPolicy is the complete list of what a sandbox may reach: domains
// (or *.domain), addresses and CIDRs, each optionally with a port, in the
// forms CheckAllowEntry accepts; everything else is denied. A provider
// refuses an entry it cannot enforce (an IPv6 one on the local provider,
// an address on a hosted one whose rules are by name), never drops it. An
// empty or nil Allow denies all egress: it is never "no policy".
type NetworkPolicy struct {
	Allow []string
}

// CreateOptions configure Create. Limits are honoured by providers that can
// enforce them (provider/local) and refused, never silently dropped, by
// providers that support limits but cannot meet the one asked.
type CreateOptions struct {
	Limits Limits
	// Env ("KEY=VALUE" entries) and Dir are the defaults of every command
	// run in the sandbox; a command's own Env and Dir override them. Only
	// providers that keep them honour them (provider/local); callers such
	// as the CLI refuse them for the others rather than drop them.
	Env []string
	Dir string
	// Image is an OCI image reference ("debian:12", "ghcr.io/o/r:tag",
	// "repo@sha256:..."): the sandbox runs on the image's root instead
	// of the host's, with the image's Env, WorkingDir and User (Env and
	// Dir above override them). Empty keeps the host's runtime. Only
	// providers that run images honour it (provider/local); callers such
	// as the CLI refuse it for the others rather than drop it.
	Image string
	// Network is the sandbox's network where the provider lets the
	// caller choose (provider/local): NetworkEgress, the default, reaches
	// the outside world (under the list ApplyNetworkPolicy puts in force,
	// once one is), NetworkNone has only loopback. Empty is the
	// provider's default. Callers such as the CLI refuse it for the
	// others rather than drop it.
	Network string
	// Labels are key=value pairs kept with the sandbox, for callers to
	// find their sandboxes by (managoat ls --filter label=k=v). Only
	// providers that can store them honour them (provider/local); callers
	// such as the CLI refuse them for the others rather than drop them.
	Labels map[string]string
	// Publish are ports inside the sandbox to publish on this machine's
	// loopback while it runs, where the provider can (provider/local, on
	// the jail as root): PublicURL is then http://127.0.0.1:PORT for the
	// first. Callers such as the CLI refuse it for the others.
	Publish []int
	// Mounts are host files and directories bound into the sandbox
	// (docker's -v HOST:SANDBOX[:ro]; mounts.go), where the provider runs
	// sandboxes on this machine (provider/local). Every other provider
	// refuses a Create with mounts (CheckNoMounts), never drops them.
	Mounts []Mount
}

// The values of CreateOptions.Network.
const (
	NetworkEgress = "egress"
	NetworkNone   = "none"
)

// Limits are resource limits applied when a sandbox is launched. A zero
// field means "no limit asked".
type Limits struct {
	MemoryBytes int64
	Pids        int
	CPUMillis   int           // 1000 = one core
	WallClock   time.Duration // budget for each command
	// DiskBytes bounds what the sandbox's home may hold (a disk quota),
	// where the provider can enforce one (provider/local as root);
	// every other provider refuses it. A local sandbox on an image has
	// its writable root layer bounded too, by the same size: it writes
	// at most twice DiskBytes to the host's disk.
	DiskBytes int64
}

// Validate refuses a negative limit: Invalid{limits}.
func (l Limits) Validate() error {
	if l.MemoryBytes < 0 || l.Pids < 0 || l.CPUMillis < 0 || l.WallClock < 0 || l.DiskBytes < 0 {
		return Invalid("limits", "a limit is negative")
	}
	return nil
}

// CreateNewOptions configure the bounded CreateNew. Timeout zero takes the
// provider's default; a negative Timeout is Invalid.
type CreateNewOptions struct {
	Timeout         time.Duration
	WaitForCapacity bool
}

// DestroyOnceOptions configure the bounded DestroyOnce.
type DestroyOnceOptions struct {
	Timeout time.Duration
}

// CheckpointOptions configure CreateCheckpoint.
type CheckpointOptions struct {
	Comment string
}

// CheckpointOnceOptions configure CreateCheckpointOnce. OperationID must
// match ^[A-Za-z0-9_-]{1,128}$ and must never be reused.
type CheckpointOnceOptions struct {
	Timeout     time.Duration
	OperationID string
}

// TerminateMode is graceful (the default) or force.
type TerminateMode string

// The termination modes.
const (
	Graceful TerminateMode = "graceful"
	Force    TerminateMode = "force"
)

// TerminateOptions configure TerminateSession. Timeout is the stop
// allowance, 1 ms to 30 s; zero means 10 s.
type TerminateOptions struct {
	Timeout time.Duration
	Mode    TerminateMode
}

// WriteFileOptions configure WriteFile. Mode zero means 0644; providers
// that upload through multipart forms ignore it.
type WriteFileOptions struct {
	Mode fs.FileMode
}

// ExecOptions configure Exec.
type ExecOptions struct {
	Env []string // "KEY=VALUE" entries added to the command's environment
	Dir string   // working directory; "" is the provider's default
	// Timeout is one monotonic budget for the whole exec, start-up
	// included; output never renews it. Zero means no budget beyond ctx.
	// A negative Timeout is an already-spent budget: the command is never
	// dispatched (the Elixir library's "timeout: 0").
	Timeout time.Duration
	// StderrToStdout appends stderr to the output in arrival order; without
	// it stderr is dropped.
	StderrToStdout bool
	// MaxOutput keeps at most this many bytes of output (0: no cap); the
	// command runs on, the rest is read and dropped, and the result says
	// Truncated. A provider that cannot cap while it reads caps the result.
	MaxOutput int
}

// ExecResult is a finished command: its output and exit code. A nonzero
// exit code is a result, not an error.
type ExecResult struct {
	Output   []byte
	ExitCode int
	// Truncated: the output went past ExecOptions.MaxOutput and Output
	// holds its first MaxOutput bytes.
	Truncated bool
}

// SpawnOptions configure Spawn.
type SpawnOptions struct {
	Env   []string
	Dir   string
	Stdin bool // wire the command's stdin
	TTY   bool // allocate a PTY (CapTTY); output then arrives as stdout only
	// TTYRows and TTYCols default to 24×80.
	TTYRows, TTYCols int
	// Detachable asks that the process survive its transport, so that it
	// can be attached again (CapAttach).
	Detachable bool
}

// AttachOptions configure Attach.
type AttachOptions struct {
	Stdin bool
}

// Provider is one way to get a sandbox. Every method takes a context; every
// error is in the taxonomy of this package. Implementations must accept a
// Handle rebuilt from its name alone, must refuse a nil handle or a handle
// of another provider with an InvalidError (see CheckHandle), and must not
// panic on any input.
//
// Optional operations are the small interfaces Checkpointer, PublicURLer,
// CreateNewer, OnceDestroyer, CheckpointOnceCreator, SessionTerminator,
// FileReader, HostPather, and
// the streamed files' FileOpener, FileStreamWriter and TreeExporter
// (files.go); the facade answers ErrNotSupported where one is missing (and
// streams through the whole-file calls where only those are there).
type Provider interface {
	// Name is the provider's registry name, such as "fake" or "sprites".
	Name() string
	// Capabilities is the set of promises the provider keeps.
	Capabilities() Capabilities

	// Create makes the named sandbox, or adopts it when it already exists.
	Create(ctx context.Context, name string, opts CreateOptions) (*Handle, error)
	// Get returns ErrNotFound only when the sandbox is surely gone.
	Get(ctx context.Context, h *Handle) (Info, error)
	// Destroy returns nil when the sandbox is already gone.
	Destroy(ctx context.Context, h *Handle) error
	// ListAllNames returns every name, or ErrTruncated; never a partial
	// view that looks whole.
	ListAllNames(ctx context.Context) ([]string, error)

	Suspend(ctx context.Context, h *Handle) error
	Resume(ctx context.Context, h *Handle) (*Handle, error)

	// WriteFile writes a file, creating parent directories.
	WriteFile(ctx context.Context, h *Handle, path string, data []byte, opts WriteFileOptions) error

	// Exec blocks until the command exits.
	Exec(ctx context.Context, h *Handle, c Cmd, opts ExecOptions) (ExecResult, error)
	// Spawn starts a command and returns once the provider acknowledged it.
	Spawn(ctx context.Context, h *Handle, c Cmd, opts SpawnOptions) (*Command, error)
	// WriteStdin, CloseStdin and StopCommand are called through the
	// Command's methods, which handle a stopped or finished command first.
	WriteStdin(ctx context.Context, c *Command, data []byte) error
	CloseStdin(ctx context.Context, c *Command) error
	// StopCommand tears down this process's end only; it always succeeds.
	StopCommand(c *Command) error

	ListSessions(ctx context.Context, h *Handle) ([]Session, error)
	// Attach replays a session's output from byte zero, then tails it.
	Attach(ctx context.Context, h *Handle, sessionID string, opts AttachOptions) (*Command, error)

	ApplyNetworkPolicy(ctx context.Context, h *Handle, p NetworkPolicy) error
}

// Checkpointer is implemented by providers with CapCheckpoint: snapshots
// of a sandbox's disk, restored in place. A reported restore failure is
// RestoreFailed, never nil.
type Checkpointer interface {
	CreateCheckpoint(ctx context.Context, h *Handle, opts CheckpointOptions) (string, error)
	RestoreCheckpoint(ctx context.Context, h *Handle, id string) error
}

// PublicURLer is implemented by providers with CapPublicURL: a URL a
// browser can open for the sandbox.
type PublicURLer interface {
	PublicURL(ctx context.Context, h *Handle) (string, error)
}

// CreateNewer is implemented by providers with CapCreateNew: one creation
// attempt that never adopts. A conflict is ErrAlreadyExists (or Invalid);
// success carries a non-empty InstanceID. A timeout is uncertain.
type CreateNewer interface {
	CreateNew(ctx context.Context, name string, opts CreateNewOptions) (*Handle, error)
}

// OnceDestroyer is implemented by providers with CapDestroyOnce: one bounded
// deletion attempt whose success requires provider-confirmed absence.
type OnceDestroyer interface {
	DestroyOnce(ctx context.Context, h *Handle, opts DestroyOnceOptions) error
}

// CheckpointOnceCreator is implemented by providers with
// CapCreateCheckpointOnce.
type CheckpointOnceCreator interface {
	CreateCheckpointOnce(ctx context.Context, h *Handle, opts CheckpointOnceOptions) (string, error)
}

// SessionTerminator is implemented by providers with CapTerminateSession.
// Nil means the provider confirmed termination or definitive absence; a
// transport failure is uncertain. The sandbox and its other sessions stay.
type SessionTerminator interface {
	TerminateSession(ctx context.Context, h *Handle, sessionID string, opts TerminateOptions) error
}

// SandboxCapabilities is implemented by a provider whose sandboxes do not
// all have the same capabilities: the runner provider's have those of the
// runner that hosts each. Capabilities() is then what every sandbox has
// (the intersection); CapabilitiesOf is what h has, and is what gates an
// operation on h (Registry.CapabilitiesOf).
type SandboxCapabilities interface {
	CapabilitiesOf(ctx context.Context, h *Handle) (Capabilities, error)
}

// PartialLister is implemented by a provider whose listing comes from
// several sources that fail apart (the runner provider's runners), so a
// caller such as `managoat ls` can show what the sources that answered
// hold and say which did not. ListAllNames stays whole or ErrTruncated.
type PartialLister interface {
	ListParts(ctx context.Context) ([]ListPart, error)
}

// ListPart is one source's names, or why it gave none.
type ListPart struct {
	Source string // e.g. a runner's name
	Names  []string
	Err    error
}

// FileReader is implemented by providers that can read a sandbox's files.
type FileReader interface {
	ReadFile(ctx context.Context, h *Handle, path string) ([]byte, error)
}

// HostPather is implemented by providers whose sandbox paths map to host
// paths (a self-hosted runner's /home/sprite).
type HostPather interface {
	HostPath(h *Handle, path string) string
}
