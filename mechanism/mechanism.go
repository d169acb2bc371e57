package mechanism

import (
	"context"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Home is the sandbox's home directory as seen from inside the sandbox.
const Home = "/home/sprite"

// DefaultLimitBytes is the per-stream capture cap of Execute (1 MiB).
const DefaultLimitBytes = 1 << 20

// DefaultPath is the PATH a command gets when the caller sets none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"

// Status is what a mechanism observes about a sandbox now.
type Status string

// The sandbox states. StatusAbsent means surely not there (never provisioned
// or destroyed); StatusUnknown means the mechanism could not determine it.
const (
	StatusAbsent      Status = "absent"
	StatusProvisioned Status = "provisioned"
	StatusStarting    Status = "starting"
	StatusRunning     Status = "running"
	StatusStopping    Status = "stopping"
	StatusStopped     Status = "stopped"
	StatusUnknown     Status = "unknown"
)

// Limits are the resource limits a sandbox is launched under. A zero field
// means "no limit requested". Each non-zero field needs the capability named
// by LimitCapabilities; a mechanism that cannot enforce one refuses the Spec.
type Limits struct {
	MemoryBytes int64         // memory cap (memory_cap)
	Pids        int64         // maximum number of tasks, including the sandbox's own init (pids_cap)
	CPUMillis   int64         // CPU quota in millicores, 1000 = one core (cpu_cap)
	DiskBytes   int64         // disk quota of the home directory, and of an image sandbox's writable layer where the mechanism says so (disk_quota)
	WallClock   time.Duration // budget of each Execute (time_budget)
}

// The values of Spec.Network.
const (
	NetworkEgress = "egress" // the outside world, through the mechanism's egress proxy
	NetworkNone   = "none"   // only lo: no egress at all
)

// MaxPublish is the most ports a Spec may publish.
const MaxPublish = 64

// Spec is what Provision builds a sandbox from.
type Spec struct {
	Limits
	// Egress is the initial egress allow list of a sandbox whose Network
	// is egress (domains, *.domains, addresses and CIDRs, each optionally
	// with ":port"; see mechanism/egress). Empty: no list, every public
	// destination is reachable until UpdateEgress sets one.
	Egress []string
	// Network is NetworkEgress (the outside world through the
	// mechanism's egress proxy), NetworkNone (only lo), or "" for the
	// mechanism's default: egress where it provides it, else none.
	Network string `json:",omitempty"`
	// Publish are ports inside the sandbox (on its loopback) the
	// mechanism publishes on the host's loopback while the sandbox runs;
	// Address says where (an Addresser). At most MaxPublish, each 1 to
	// 65535 and once.
	Publish []int `json:",omitempty"`
	// HomeDir is the host directory mounted at Home. Empty lets the
	// mechanism create one in its own state. It must be absolute.
	HomeDir string
	// Env is added to every command's environment (after the defaults,
	// before ExecOptions.Env). The managing process's environment is never
	// inherited.
	Env []string
	// Image, when set, is the root the sandbox runs on instead of the
	// host's runtime: an unpacked image shared read-only by every sandbox
	// on it, under a writable layer of the sandbox's own.
	Image *ImageRoot `json:",omitempty"`
	// Mounts are host files and directories bound into the sandbox
	// (mounts.go); a mechanism that cannot bind them refuses the Spec
	// (capability HostMounts). At most MaxMounts.
	Mounts []Mount `json:",omitempty"`
}

// ImageRoot is an unpacked OCI image a sandbox runs on (package image).
type ImageRoot struct {
	// Dir is the unpacked root (absolute); never written.
	Dir string
	// Ref and Digest name the image, for reports.
	Ref, Digest string
	// UID and GID are the image's user, resolved against its own
	// /etc/passwd. A mechanism that cannot give the workload uid 0 of
	// the sandbox runs it as its default uid when UID is 0.
	UID, GID int
}

// Validate reports an *InvalidError for a malformed Spec.
func (s Spec) Validate() error {
	switch {
	case s.MemoryBytes < 0:
		return Invalid("Limits.MemoryBytes", "negative")
	case s.Pids < 0:
		return Invalid("Limits.Pids", "negative")
	case s.CPUMillis < 0:
		return Invalid("Limits.CPUMillis", "negative")
	case s.DiskBytes < 0:
		return Invalid("Limits.DiskBytes", "negative")
	case s.WallClock < 0:
		return Invalid("Limits.WallClock", "negative")
	case s.HomeDir != "" && !filepath.IsAbs(s.HomeDir):
		return Invalid("HomeDir", "not an absolute path")
	case s.Image != nil && !filepath.IsAbs(s.Image.Dir):
		return Invalid("Image.Dir", "not an absolute path")
	case s.Image != nil && (s.Image.UID < 0 || s.Image.GID < 0):
		return Invalid("Image.UID", "negative")
	}
	if len(s.Publish) > MaxPublish {
		return Invalid("Publish", fmt.Sprintf("%d ports: at most %d", len(s.Publish), MaxPublish))
	}
	for i, p := range s.Publish {
		if p < 1 || p > 65535 {
			return Invalid("Publish", fmt.Sprintf("port %d is not 1 to 65535", p))
		}
		for _, q := range s.Publish[:i] {
			if q == p {
				return Invalid("Publish", fmt.Sprintf("port %d twice", p))
			}
		}
	}
	for _, e := range s.Env {
		if !strings.Contains(e, "=") {
			return Invalid("Env", fmt.Sprintf("%q is not KEY=VALUE", e))
		}
	}
	return validateMounts(s.Mounts)
}

// ValidateID reports an *InvalidError unless id is 1 to 128 characters of
// [A-Za-z0-9._-] and not "." or "..". IDs name directories and cgroups.
func ValidateID(id string) error {
	if id == "" || len(id) > 128 || id == "." || id == ".." {
		return Invalid("id", fmt.Sprintf("%q must be 1 to 128 characters and not . or ..", id))
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return Invalid("id", fmt.Sprintf("%q has a character outside [A-Za-z0-9._-]", id))
		}
	}
	return nil
}

// Stream names one of a command's output streams.
type Stream int

// The two output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return fmt.Sprintf("stream(%d)", int(s))
}

// ExecOptions tune one Execute. None is required.
type ExecOptions struct {
	Env   []string  // extra KEY=VALUE pairs (override Spec.Env and defaults)
	Dir   string    // working directory inside the sandbox; default Home
	Stdin io.Reader // default: empty (EOF at once), never the caller's stdin
	// OnOutput receives raw chunks as they are read from the command, never
	// split into lines. Calls are serialized; the chunk is the sink's to
	// keep. Chunks past LimitBytes are still delivered.
	OnOutput func(s Stream, chunk []byte)
	// LimitBytes caps each captured stream; 0 means DefaultLimitBytes.
	LimitBytes int
	// Timeout is a wall-clock ceiling the caller declares for this call; it
	// is enforced like the Spec's WallClock (the smaller wins) and reported
	// as LimitExceeded wall_clock.
	Timeout time.Duration
}

// Completion is the result of a command that ran.
type Completion struct {
	// ExitStatus is the command's exit code, or 128+signal when a signal
	// ended it (the shell's convention; Signal says which).
	ExitStatus int
	Signal     syscall.Signal // 0 unless a signal ended the command
	Stdout     []byte         // the first LimitBytes of stdout
	Stderr     []byte         // the first LimitBytes of stderr
	Truncated  bool           // either stream was cut
	Duration   time.Duration
}

// ProcessSpec describes a process started with StartProcess.
type ProcessSpec struct {
	Argv   []string
	Env    []string // extra KEY=VALUE pairs
	Dir    string   // default Home
	Stdin  io.Reader
	Stdout io.Writer // nil discards
	Stderr io.Writer // nil discards
}

// ExitState is how a process started with StartProcess ended.
type ExitState struct {
	Code   int            // exit code, or 128+signal
	Signal syscall.Signal // 0 unless a signal ended it
}

// Process is a process running inside a sandbox.
type Process interface {
	// Pid is the process's id as the host sees it (0 if unknown).
	Pid() int
	// Signal sends sig to the process's whole process group.
	Signal(sig syscall.Signal) error
	// Wait waits for the process to exit and its output copies to finish.
	// A *LimitExceededError reports a memory or pids kill attributed from
	// the kernel's counters (with the ExitState still filled in).
	Wait() (ExitState, error)
}

// Usage is a sandbox's current consumption, from the kernel's counters:
// the Elixir library's usage map (cpu_millicores, memory_mb, disk_mb) as
// a struct, in bytes. A mechanism with no counter for a figure (trusted
// has no cgroup) leaves it 0; a stopped sandbox has no CPU rate and no
// memory charge.
type Usage struct {
	CPUTime time.Duration // cumulative CPU time of every task in the sandbox
	// CPUMillicores is the current CPU use: the CPU time the sandbox's
	// tasks took over a window of UsageWindow, per second of wall clock,
	// in thousandths of a core (1000: one core busy all the window).
	CPUMillicores int64
	MemoryBytes   int64 // current memory charge (cgroup) or RSS
	DiskBytes     int64 // allocated bytes under the home directory, and of the sandbox's own writable layer where it has one (the jail's image sandboxes)
}

// UsageWindow is the window over which Usage measures the CPU rate: a
// call of Usage on a running sandbox takes about this long.
const UsageWindow = 250 * time.Millisecond

// CPURate samples a cumulative CPU time (sample says false when it cannot
// be read) twice, UsageWindow apart, and returns the rate in millicores
// and the second sample; ctx ending cuts the window short (the rate is
// then over the time waited, or 0 with ctx's error before any).
func CPURate(ctx context.Context, sample func() (time.Duration, bool)) (int64, time.Duration, error) {
	c0, ok := sample()
	if !ok {
		return 0, 0, nil
	}
	t0 := time.Now()
	t := time.NewTimer(UsageWindow)
	select {
	case <-ctx.Done():
		t.Stop()
	case <-t.C:
	}
	c1, ok := sample()
	dt := time.Since(t0)
	if !ok {
		return 0, c0, nil
	}
	if dt <= 0 || c1 < c0 {
		return 0, c1, ctx.Err()
	}
	return int64((c1 - c0) * 1000 / dt), c1, nil
}

// Mechanism is an isolation mechanism. All methods are safe for concurrent
// use. IDs must pass ValidateID.
type Mechanism interface {
	// Name is a short stable name ("jail", "trusted").
	Name() string
	// Provision creates the sandbox's resources; it runs the Gate first.
	// Provisioning an existing id with the same Spec adopts it (nil);
	// with a different Spec it is ErrExists.
	Provision(ctx context.Context, id string, spec Spec) error
	// Start launches a provisioned or stopped sandbox (the Gate runs again).
	// Starting a running sandbox is a no-op. ErrNotFound if absent.
	Start(ctx context.Context, id string) error
	// Stop ends every process of the sandbox, keeping its files. Stopping
	// an absent or stopped sandbox is nil.
	Stop(ctx context.Context, id string) error
	// Destroy releases everything; nil when already absent.
	Destroy(ctx context.Context, id string) error
	// Status observes the sandbox now.
	Status(ctx context.Context, id string) (Status, error)
	// ListRunning returns the full IDs of this mechanism's running
	// sandboxes; an empty list is not an error.
	ListRunning(ctx context.Context) ([]string, error)
	// Usage reports the sandbox's consumption.
	Usage(ctx context.Context, id string) (Usage, error)
	// Execute runs argv inside the running sandbox (see the package doc
	// for the three outcomes).
	Execute(ctx context.Context, id string, argv []string, opts ExecOptions) (Completion, error)
	// StartProcess starts a long-lived process inside the running sandbox.
	// Failures to start are *CouldNotRunError.
	StartProcess(ctx context.Context, id string, spec ProcessSpec) (Process, error)
	// HostPath maps a path inside the sandbox under Home (absolute, or
	// relative to Home) to the host path backing it. ErrInvalid if it
	// escapes Home, ErrNotFound if the sandbox is absent.
	HostPath(id, sandboxPath string) (string, error)
}

// CapabilityRequirer is implemented by a mechanism that says what the host
// must provide. Without it, a mechanism requires DefaultRequired.
type CapabilityRequirer interface {
	RequiredCapabilities() []Capability
}

// CapabilityConstructor is implemented by a mechanism that builds some
// capabilities itself. Without it, it constructs nothing.
type CapabilityConstructor interface {
	ConstructedCapabilities() []Capability
}

// CapabilityGuarantor is implemented by a mechanism that says which
// guarantees it enforces once its requirements are met. Without it, it
// guarantees nothing and every limit in a Spec is refused.
type CapabilityGuarantor interface {
	GuaranteedCapabilities() []Capability
}

// Addresser is implemented by a mechanism that can publish a port of a
// sandbox to this machine only. Address returns "host:port" or "" (none).
type Addresser interface {
	Address(ctx context.Context, id string, port int) (string, error)
}

// EgressUpdater is implemented by a mechanism that enforces egress per
// connection. UpdateEgress replaces the allowlist of a running sandbox;
// an empty list is deny-all. It applies to the next connection.
type EgressUpdater interface {
	UpdateEgress(ctx context.Context, id string, allow []string) error
}

// Freezer is implemented by a mechanism that can stop every process of a
// running sandbox where it is, all at once, and continue them later: a
// suspend that keeps memory and sessions. A frozen sandbox's init does not
// answer either; the caller thaws it before asking anything of it. Freeze
// of a sandbox that does not run is ErrNotRunning; Thaw of one that is not
// frozen does nothing.
type Freezer interface {
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
}

// OrphanSweeper is implemented by a mechanism that can find what sandboxes
// left on the host when their state went without a Destroy (cgroups,
// sockets) and remove it. SweepOrphans returns what it removed; it never
// touches a sandbox whose state is there, nor anything made in the last
// minute.
type OrphanSweeper interface {
	SweepOrphans(ctx context.Context) ([]string, error)
}

// Required returns m's required capabilities (DefaultRequired when silent).
func Required(m Mechanism) []Capability {
	if r, ok := m.(CapabilityRequirer); ok {
		return r.RequiredCapabilities()
	}
	return append([]Capability(nil), DefaultRequired...)
}

// Constructed returns m's constructed capabilities (none when silent).
func Constructed(m Mechanism) []Capability {
	if c, ok := m.(CapabilityConstructor); ok {
		return c.ConstructedCapabilities()
	}
	return nil
}

// Guaranteed returns m's guaranteed capabilities (none when silent).
func Guaranteed(m Mechanism) []Capability {
	if g, ok := m.(CapabilityGuarantor); ok {
		return g.GuaranteedCapabilities()
	}
	return nil
}

// Address returns the loopback address publishing port of sandbox id, or ""
// when m cannot publish or there is nothing to reach.
func Address(ctx context.Context, m Mechanism, id string, port int) (string, error) {
	if a, ok := m.(Addresser); ok {
		return a.Address(ctx, id, port)
	}
	return "", nil
}

// UpdateEgress replaces the egress allowlist, or returns ErrNotSupported
// when m does not enforce egress per connection.
func UpdateEgress(ctx context.Context, m Mechanism, id string, allow []string) error {
	if u, ok := m.(EgressUpdater); ok {
		return u.UpdateEgress(ctx, id, allow)
	}
	return fmt.Errorf("%w: mechanism %s does not enforce egress per connection", ErrNotSupported, m.Name())
}

// ResolveHome maps sandboxPath (absolute under Home, or relative to Home) to
// a path under hostHome, or returns an *InvalidError when it escapes Home.
// Mechanisms use it to implement HostPath.
func ResolveHome(hostHome, sandboxPath string) (string, error) {
	p := sandboxPath
	if !path.IsAbs(p) {
		p = path.Join(Home, p)
	}
	clean := path.Clean(p)
	if clean != Home && !strings.HasPrefix(clean, Home+"/") {
		return "", Invalid("path", fmt.Sprintf("%q escapes %s", sandboxPath, Home))
	}
	rel := strings.TrimPrefix(clean, Home)
	return filepath.Join(hostHome, filepath.FromSlash(rel)), nil
}
