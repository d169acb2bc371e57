// Package local is managoat's embedded default provider: sandboxes on this
// machine, isolated by a mechanism.Mechanism (the native jail by default,
// or trusted, or others), with detachable sessions that outlive the process
// that started them.
//
//	p, err := local.New(local.Config{})            // jail, state in DefaultStateDir()
//	h, err := p.Create(ctx, "agent-1", sandbox.CreateOptions{})
//	cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi"}}, sandbox.SpawnOptions{})
//
// Each sandbox has a small supervisor process, this same binary
// re-executed (the containerd-shim pattern), detached in its own session
// so a Ctrl-C in the caller does not reach it. The package's init function
// takes that role before main runs, so a program that opens built-in
// mechanisms needs no hook, and a re-executed process never runs the
// program's main; a program that passes its own Config.Mechanism calls
// MaybeRunSupervisorWith first thing in main (see there).
//
// A CreateOptions.Dir is made when the sandbox is created (mkdir -p in the
// sandbox, as its commands' user, workdir.go), as docker does for -w; one
// that user cannot make refuses the Create (Invalid{dir}) and leaves no
// sandbox.
//
// # State
//
// Everything lives under the state directory (Config.StateDir, default
// DefaultStateDir()):
//
//	sandboxes/<name>/meta.json     the sandbox record; created by one rename
//	sandboxes/<name>/sup.sock      the supervisor's socket (sup.lock, sup.log)
//	sandboxes/<name>/sessions/<id>/{meta.json,journal,exit}
//	instances/<instance>/home      the sandbox's disk, /home/sprite inside
//	instances/<instance>/checkpoints/<id>
//	mech/<mechanism>/              the mechanism's own state
//	tmp/                           records under construction, and trash
//
// A sandbox record is built in tmp/ and renamed into sandboxes/ in one
// step, so a name is claimed atomically (of two concurrent CreateNew calls
// exactly one wins), a full or unwritable disk leaves nothing that
// ListAllNames shows, and a destroyed sandbox disappears at once (its record
// is renamed to tmp/ before anything is torn down).
//
// # Sessions
//
// Spawn asks the sandbox's supervisor to start the command; the supervisor
// owns the command's pipes and appends every chunk of stdout and stderr, in
// the order it read them, to the session's journal (see package journal),
// then the exit status. (stdout and stderr are two pipes: a write to each
// within microseconds of the other may be recorded in either order; the
// order within each stream is exact.) Spawn and Attach both read that journal from byte
// zero and then tail it, so every attacher, however many at once, gets the
// whole output exactly once, and a caller that exited can come back and
// Attach. A kill -9 of every managoat process loses no byte already
// journaled; a session whose supervisor died reads back its output and then
// Error{closed_before_exit}, never a made-up exit.
//
// Get reports running only when the supervisor answers and the mechanism
// sees the sandbox running (or, for a sandbox made with
// Config.LazySupervisor, when the mechanism sees it running). A sandbox
// that runs on after its supervisor died (kill -9) is adopted by a new
// supervisor there and then, and reported running (raw "readopted"); with
// no supervisor and nothing running, the sandbox is stopped with its disk
// kept (StatusSuspended, raw state "stopped"), and the next Exec, Spawn or
// Resume starts it again.
//
// # Operations
//
// Create provisions the mechanism sandbox with the CreateOptions limits
// (applied at launch by the mechanism; a limit it cannot enforce is
// refused, Invalid with the capability named, and nothing is left behind)
// and starts the supervisor. Exec runs through the mechanism's Execute
// under one deadline. The WallClock limit bounds every command: an Exec
// through the mechanism, a spawned one through its supervisor (or this
// provider, when it runs the command itself), which kills it at the end
// of its budget and says so on its stderr (supervisor.BudgetMessage).
// Suspend freezes every process of the sandbox where the mechanism can
// (mechanism.Freezer: the jail's cgroup freezer, an OCI runtime's pause),
// and otherwise stops
// each live session's process group (SIGSTOP; trusted,
// which has no cgroup, so a process that left its session's group runs
// on); Resume continues them. An Exec, Spawn or ApplyNetworkPolicy on a
// suspended sandbox resumes it first, as a hosted provider resumes a
// paused sandbox on use. Files are read and written under the sandbox's
// home only (/home/sprite, or a path relative to it), through os.Root,
// which refuses "../" and symlink escapes; this holds on trusted too,
// whose paths are otherwise host paths. Checkpoints copy the home, with
// reflinks where the filesystem allows, through directory descriptors, so
// a sandbox that swaps a directory for a symlink while the copy runs
// cannot send it to the host (copytree.go); CreateCheckpointOnce names the
// checkpoint after the host's operation id, so one operation makes one
// checkpoint. DestroyOnce is Destroy under a
// bound, confirmed by the record's absence.
//
// SpawnOptions.TTY runs the session on a pseudo-terminal (TTYRows×TTYCols,
// default 24×80): the slave is the command's stdin, stdout and stderr, so
// all output arrives as stdout, echo included; CloseStdin sends an EOT
// (^D). The mechanisms start the process without making the terminal its
// controlling terminal, so a ^C written to stdin does not signal it (use
// TerminateSession).
//
// Every command's PATH starts with the home's .local/bin, .npm-global/bin
// and .bun/bin (npm_config_prefix is the home's .npm-global), and on a
// mechanism whose sandboxes see host paths (trusted) /home/sprite in the
// command line is rewritten to the sandbox's home, as the runner's trusted
// mode did; the caller's Env overrides both. A command that cannot start is
// Invalid{could_not_run}, never exit 127 (the trusted runner's 127 was a
// command that did not run reported as an exit code).
//
// A sandbox reaches the outside world (CreateOptions.Network egress, the
// default on a mechanism that provides it: the jail as root, through
// mechanism/egress) or has only loopback (none). ApplyNetworkPolicy goes
// through the mechanism's egress update (network.go): the list is
// domains, *.domains, IPv4 addresses and CIDRs, each optionally with
// :port (an IPv6 one is refused: egress is IPv4 only), a bad entry is
// Invalid naming it, Allow [] denies all, and the list is
// in force for new connections and cuts the open ones it denies when
// the call returns; the provider advertises network_policy where the
// mechanism enforces it. A sandbox made with network none refuses a
// non-empty list naming egress_allowlist, and a mechanism without any
// egress control (trusted) answers ErrNotSupported. What a sandbox's
// policy refuses is a line in its supervisor's log (in the process that
// serves its egress: run's own stderr), and Get reports the list in force
// (egress_allow), the network asked for, and the latest refusals
// (egress_refused). A sandbox made with
// CreateOptions.Publish has its ports published on this machine's
// loopback while it runs (as root: the jail, runc, and runsc with an
// egress network; rootless: the jail), for this user only: a unix socket
// no other user can connect to, and a TCP port that relays only this
// user's (and root's) connections (mechanism/egress's Published).
// PublicURL is http://127.0.0.1:PORT for the first, never an address
// another machine can reach (public_url is advertised there; elsewhere
// PublicURL is ErrUnsupported). PublishedPorts and PortAddress (the unix
// socket) are what `managoat serve` proxies (platform/api).
//
// Where this differs from Fountain's runner daemon's local sandboxes
// (runner-protocol spec §2.6, §2.9): its journals lived in the daemon's
// memory and sessions died with it; here they are files, owned by a
// supervisor per sandbox, and outlive every managoat process. Attach reads
// the journal by byte offset, so Fountain's daemon's duplicated or reordered
// frames on attach (D2) cannot happen, and no journal is held in memory
// (D6). Relative paths cannot escape the home (D5). A command that fails to
// start is not a session with exit 127. Status comes from the kernel and
// the supervisor's socket, never from a stored flag. Finished sessions are
// kept (Fountain's daemon pruned beyond 100 per sandbox).
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/journal"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "local"

// Config configures New.
type Config struct {
	// StateDir holds every sandbox; "" means DefaultStateDir().
	StateDir string
	// Mechanism isolates the sandboxes. nil means the mechanism named by
	// MechanismName, opened with OpenMechanism.
	Mechanism mechanism.Mechanism
	// MechanismName is used when Mechanism is nil: "jail" (the default),
	// "trusted", "oci" or "oci:runsc".
	MechanismName string
	// Logger receives the provider's logs; nil discards them.
	Logger *slog.Logger
	// LazySupervisor makes Create start the mechanism's sandbox in this
	// process and leave the supervisor for the first operation that needs
	// it (Spawn, Attach's stdin, Suspend, Resume, TerminateSession):
	// create, exec and destroy of an ephemeral sandbox then start no
	// supervisor at all. Get reports such a sandbox running from the
	// mechanism's own status while no supervisor runs.
	LazySupervisor bool
	// DefaultLimits fill the limits a create leaves at zero, for each cap
	// the mechanism guarantees and this host has (the jail's memory and
	// pids caps, runc's; trusted and runsc guarantee none, and a rootless
	// jail on a host without delegated cgroups cannot have them, so
	// nothing is filled there): a
	// sandbox made without limits still cannot fork-bomb or exhaust the
	// host. nil means DefaultLimits(); a pointer to a zero Limits turns
	// the defaults off.
	DefaultLimits *sandbox.Limits
	// Ephemeral says the caller destroys every sandbox it creates before
	// it exits (managoat run): a sandbox's record is then not flushed to
	// disk with fsync (the rename that makes the sandbox exist still is
	// atomic). Only a power loss while such a sandbox exists can leave its
	// record unreadable.
	Ephemeral bool
	// JournalRetention bounds the session journals of each sandbox this
	// provider creates (size and age; see journal.Retention): finished
	// sessions' journals are pruned, oldest first, and Attach of a pruned
	// session says so. nil means journal.DefaultRetention.
	JournalRetention *journal.Retention
}

// DefaultLimits are the limits a sandbox gets for each cap its create left
// at zero: 1024 processes, half of this host's memory up to 8 GiB, and a
// home of DefaultDiskBytes (10 GiB) where the mechanism bounds homes
// cheaply (quota.go).
// They are what a host survives, not what a workload needs: ask for less
// with the create's limits.
func DefaultLimits() sandbox.Limits {
	mem := int64(8 << 30)
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		if half := int64(si.Totalram) * int64(si.Unit) / 2; half > 0 && half < mem {
			mem = half
		}
	}
	return sandbox.Limits{Pids: 1024, MemoryBytes: mem, DiskBytes: DefaultDiskBytes()}
}

// DefaultStateDir is $MANAGOAT_HOME, else /var/lib/managoat for root, else
// $XDG_STATE_HOME/managoat (~/.local/state/managoat).
func DefaultStateDir() string {
	if d := os.Getenv("MANAGOAT_HOME"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/managoat"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "managoat")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf("managoat-%d", os.Getuid()))
	}
	return filepath.Join(home, ".local", "state", "managoat")
}

// Provider is the local provider. It is safe for concurrent use, and
// several processes may share one state directory.
type Provider struct {
	state string
	mech  mechanism.Mechanism
	log   *slog.Logger
	caps  sandbox.Capabilities
	lazy  bool
	// nosync: records are not fsynced (Config.Ephemeral).
	nosync    bool
	retention *journal.Retention
	// supEnv is added to each supervisor's environment: EnvHook=main when
	// the mechanism was the caller's own (Config.Mechanism).
	supEnv []string
	// defaults fill a create's zero limits (Config.DefaultLimits), only
	// for the caps the mechanism guarantees.
	defaults sandbox.Limits
	diskWhy  string // how the default home quota is enforced, or why none (quota.go)
}

var (
	_ sandbox.Provider              = (*Provider)(nil)
	_ sandbox.CreateNewer           = (*Provider)(nil)
	_ sandbox.OnceDestroyer         = (*Provider)(nil)
	_ sandbox.CheckpointOnceCreator = (*Provider)(nil)
	_ sandbox.SessionTerminator     = (*Provider)(nil)
	_ sandbox.FileReader            = (*Provider)(nil)
	_ sandbox.HostPather            = (*Provider)(nil)
)

// New returns a provider keeping its sandboxes under cfg.StateDir. It
// fails with a clear error when the state directory cannot be created or
// written.
func New(cfg Config) (*Provider, error) {
	if hookPending.Load() {
		// A supervisor whose main went on without taking the role.
		supervisor.ForgotHook("local.MaybeRunSupervisorWith")
	}
	state := cfg.StateDir
	if state == "" {
		state = DefaultStateDir()
	}
	abs, err := filepath.Abs(state)
	if err != nil {
		return nil, stateErr("state dir", err)
	}
	state = abs
	for _, d := range []string{"sandboxes", "instances", "tmp", "mech"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			return nil, stateErr("state dir", err)
		}
	}
	if err := privateStateDir(state); err != nil {
		return nil, stateErr("state dir", err)
	}
	// Prove the directory is writable now rather than half-way through a
	// Create: access(2) sees both the permissions and a read-only mount,
	// without the journal transactions of creating and removing a file
	// (every CLI command opens the provider). A full disk is reported by
	// the Create that meets it, which leaves nothing behind.
	if err := unix.Access(filepath.Join(state, "tmp"), unix.W_OK); err != nil {
		return nil, stateErr("state dir not writable", err)
	}
	m := cfg.Mechanism
	var supEnv []string
	if m != nil {
		supEnv = []string{supervisor.EnvHook + "=main"}
	}
	if m == nil {
		name := cfg.MechanismName
		if name == "" {
			name = "jail"
		}
		if m, err = OpenMechanism(name, state); err != nil {
			return nil, err
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Provider{state: state, mech: m, log: log, lazy: cfg.LazySupervisor, nosync: cfg.Ephemeral, supEnv: supEnv, retention: cfg.JournalRetention}
	d := DefaultLimits()
	if cfg.DefaultLimits != nil {
		d = *cfg.DefaultLimits
	}
	// A default is set only where the cap is the mechanism's and this host
	// has it (a rootless jail guarantees both caps, but a host without
	// delegated cgroups cannot give them to an unprivileged user: its
	// sandboxes then get no default there, instead of every create
	// failing on a limit nobody asked for).
	g := mechanism.Guaranteed(m)
	has := func(c mechanism.Capability) bool {
		return slices.Contains(g, c) && mechanism.HostProber().Probe(context.Background(), c).Available
	}
	if d.Pids > 0 && has(mechanism.PidsCap) {
		p.defaults.Pids = d.Pids
	}
	if d.MemoryBytes > 0 && has(mechanism.MemoryCap) {
		p.defaults.MemoryBytes = d.MemoryBytes
	}
	_, envDisk := os.LookupEnv(EnvDefaultDisk)
	p.defaults.DiskBytes, p.diskWhy = defaultDisk(m, state, d.DiskBytes, cfg.DefaultLimits != nil || envDisk) // quota.go
	_ = p.Sweep(context.Background())
	p.caps = sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapAttach, sandbox.CapTerminateSession,
		sandbox.CapForceTerminateSession, sandbox.CapCreateNew, sandbox.CapDestroyOnce, sandbox.CapCheckpoint,
		sandbox.CapCreateCheckpointOnce, sandbox.CapTTY)
	if enforcesEgress(m) {
		p.caps = p.caps.With(sandbox.CapNetworkPolicy)
	}
	if publishes(m) {
		p.caps = p.caps.With(sandbox.CapPublicURL)
	}
	return p, nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return Name }

// Capabilities implements sandbox.Provider.
func (p *Provider) Capabilities() sandbox.Capabilities { return p.caps }

// StateDir is the directory the provider keeps its sandboxes in.
func (p *Provider) StateDir() string { return p.state }

// Mechanism is the mechanism the provider creates sandboxes with.
func (p *Provider) Mechanism() mechanism.Mechanism { return p.mech }

func stateErr(what string, err error) error {
	return &sandbox.ProviderError{Provider: Name, Reason: what, Err: err}
}

// record is a sandbox's meta.json.
type record struct {
	Name       string         `json:"name"`
	InstanceID string         `json:"instance_id"`
	Fresh      bool           `json:"fresh,omitempty"` // made by CreateNew
	Mechanism  string         `json:"mechanism"`
	Limits     sandbox.Limits `json:"limits"`
	CreatedAt  time.Time      `json:"created_at"`
	// Lazy: created without a supervisor (Config.LazySupervisor).
	Lazy bool `json:"lazy,omitempty"`
	// Env and Dir are the defaults of every command (CreateOptions).
	Env []string `json:"env,omitempty"`
	Dir string   `json:"dir,omitempty"`
	// Labels are the caller's (CreateOptions.Labels).
	Labels map[string]string `json:"labels,omitempty"`
	// Publish are the ports published on the host's loopback
	// (CreateOptions.Publish); PublicURL is the first's.
	Publish []int `json:"publish,omitempty"`
	// Mounts are the host paths bound in, as asked (mounts.go).
	Mounts []sandbox.Mount `json:"mounts,omitempty"`
	// Network is CreateOptions.Network ("" the default: egress where the
	// mechanism gives it).
	Network string `json:"network,omitempty"`
}

// dir is the working directory of a command asked to run in d.
func (r *record) dir(d string) string {
	if d == "" {
		return r.Dir
	}
	return d
}

func (p *Provider) sandboxDir(name string) string { return filepath.Join(p.state, "sandboxes", name) }
func (p *Provider) instanceDir(iid string) string { return filepath.Join(p.state, "instances", iid) }
func (p *Provider) homeDir(iid string) string     { return filepath.Join(p.instanceDir(iid), "home") }

// load reads a sandbox's record: ErrNotFound when it surely does not exist.
func (p *Provider) load(name string) (*record, string, error) {
	dir := p.sandboxDir(name)
	r, err := readRecord(dir)
	var corrupt *recordError
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, "", sandbox.ErrNotFound
	case errors.As(err, &corrupt):
		return nil, "", &sandbox.ProviderError{Provider: Name, Reason: "corrupt record", Err: corrupt.err}
	case err != nil:
		return nil, "", sandbox.Unavailable("state", err)
	}
	return r, dir, nil
}

func (p *Provider) handle(h *sandbox.Handle) (*record, string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, "", err
	}
	return p.load(h.Name)
}

// mechFor returns the mechanism a sandbox was made with.
func (p *Provider) mechFor(r *record) (mechanism.Mechanism, error) {
	if r.Mechanism == "" || r.Mechanism == p.mech.Name() {
		return p.mech, nil
	}
	return OpenMechanism(r.Mechanism, p.state)
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create makes the named sandbox, or adopts it when it exists.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	if _, _, err := p.load(name); err == nil {
		return sandbox.BuildHandle(Name, name), nil
	}
	for _, e := range opts.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, sandbox.Invalid("env", fmt.Sprintf("%q is not KEY=VALUE", e))
		}
	}
	h, err := p.create(ctx, name, opts, false)
	if errors.Is(err, sandbox.ErrAlreadyExists) {
		return sandbox.BuildHandle(Name, name), nil
	}
	return h, err
}

// CreateNew makes the named sandbox in one attempt that never adopts: an
// existing name is ErrAlreadyExists. The handle carries a fresh InstanceID.
func (p *Provider) CreateNew(ctx context.Context, name string, opts sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	if opts.Timeout < 0 {
		return nil, sandbox.Invalid("timeout", "negative CreateNew timeout")
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	if _, _, err := p.load(name); err == nil {
		return nil, sandbox.ErrAlreadyExists
	}
	return p.create(ctx, name, sandbox.CreateOptions{}, true)
}

// limitsJSON is a sandbox's limits for Get's raw info (zero ones left out).
func limitsJSON(l sandbox.Limits) map[string]any {
	m := map[string]any{}
	if l.MemoryBytes > 0 {
		m["memory_bytes"] = l.MemoryBytes
	}
	if l.Pids > 0 {
		m["pids"] = l.Pids
	}
	if l.CPUMillis > 0 {
		m["cpu_millis"] = l.CPUMillis
	}
	if l.WallClock > 0 {
		m["wall_clock"] = l.WallClock.String()
	}
	if l.DiskBytes > 0 {
		m["disk_bytes"] = l.DiskBytes
	}
	return m
}

func limitsSpec(l sandbox.Limits, home string) (mechanism.Spec, error) {
	if err := l.Validate(); err != nil {
		return mechanism.Spec{}, err
	}
	return mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: l.MemoryBytes, Pids: int64(l.Pids),
		CPUMillis: int64(l.CPUMillis), WallClock: l.WallClock, DiskBytes: l.DiskBytes}, HomeDir: home}, nil
}

func (p *Provider) create(ctx context.Context, name string, opts sandbox.CreateOptions, fresh bool) (*sandbox.Handle, error) {
	limits := opts.Limits
	if limits.Pids == 0 {
		limits.Pids = p.defaults.Pids
	}
	if limits.MemoryBytes == 0 {
		limits.MemoryBytes = p.defaults.MemoryBytes
	}
	if limits.DiskBytes == 0 {
		limits.DiskBytes = p.defaults.DiskBytes
	}
	iid := newID()
	home := p.homeDir(iid)
	spec, err := limitsSpec(limits, home)
	if err != nil {
		return nil, err
	}
	if spec.Network, err = networkOf(opts.Network); err != nil {
		return nil, err
	}
	if spec.Publish, err = p.publishOf(opts.Publish); err != nil {
		return nil, err
	}
	if spec.Mounts, err = mountsSpec(opts.Mounts); err != nil { // mounts.go
		return nil, err
	}
	if err := p.withImage(ctx, iid, &spec, &opts); err != nil {
		return nil, err
	}
	// The record is made in tmp first, before the instance: a Create cut
	// short leaves this mark, which Sweep looks for. The mark is locked
	// while this Create runs, however long, and Sweep leaves it alone.
	tmp := filepath.Join(p.state, "tmp", "new-"+iid)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, stateErr("create record", err)
	}
	lockedUnlock, err := flock.Lock(ctx, tmp)
	if err != nil {
		os.Remove(tmp)
		return nil, stateErr("create record", err)
	}
	unlock := sync.OnceFunc(lockedUnlock)
	defer unlock()
	// undo releases what this Create made; the mark goes only once all of
	// it has, or stays for Sweep to finish the job.
	undo := func() {
		p.releaseImage(iid)
		err := p.mech.Destroy(context.WithoutCancel(ctx), iid)
		if err == nil {
			err = removeAll(context.WithoutCancel(ctx), p.instanceDir(iid))
		}
		if err == nil {
			os.RemoveAll(tmp)
		}
	}
	if err := os.MkdirAll(home, 0o755); err != nil {
		undo()
		return nil, stateErr("create home", err)
	}
	if err := p.mech.Provision(ctx, iid, spec); err != nil {
		undo()
		return nil, mechErr("provision", err)
	}
	// Without the file, the supervisor applies journal.DefaultRetention.
	if p.retention != nil {
		if err := supervisor.WriteRetention(tmp, *p.retention); err != nil {
			undo()
			return nil, stateErr("create record", err)
		}
	}
	rec := record{Name: name, InstanceID: iid, Fresh: fresh, Mechanism: p.mech.Name(), Limits: limits, CreatedAt: time.Now().UTC(), Lazy: p.lazy,
		Env: opts.Env, Dir: opts.Dir, Labels: opts.Labels, Publish: spec.Publish, Mounts: opts.Mounts, Network: opts.Network}
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := writeRecord(filepath.Join(tmp, "meta.json"), b, !p.nosync); err != nil {
		undo()
		return nil, stateErr("create record", err)
	}
	// The one step that makes the sandbox exist: a rename onto a name
	// that is taken fails (the directory there is never empty).
	if err := os.Rename(tmp, p.sandboxDir(name)); err != nil {
		undo()
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, os.ErrExist) {
			return nil, sandbox.ErrAlreadyExists
		}
		return nil, stateErr("create record", err)
	}
	dir := p.sandboxDir(name)
	start := func() error { return supervisor.Launch(ctx, dir, p.supEnv...) }
	if p.lazy {
		start = func() error { return p.mech.Start(ctx, iid) }
	}
	if err := start(); err != nil {
		// Creation failed: leave nothing behind. The record's lock moved
		// with it, and destroy takes it: release it first.
		unlock()
		_ = p.destroy(context.WithoutCancel(ctx), name)
		return nil, mechErr("start", err)
	}
	if opts.Dir != "" {
		if err := p.makeWorkDir(ctx, name, opts.Dir); err != nil { // workdir.go
			unlock()
			_ = p.destroy(context.WithoutCancel(ctx), name)
			return nil, err
		}
	}
	h := sandbox.BuildHandle(Name, name)
	if fresh {
		h.InstanceID = iid
	}
	return h, nil
}

// writeRecord creates path with b, flushed to disk when sync.
func writeRecord(path string, b []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// mechErr maps a mechanism (or supervisor start) error into the taxonomy.
func mechErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *supervisor.StartError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, mechanism.ErrCapabilityUnavailable):
		return &sandbox.InvalidError{Reason: "capability_unavailable", Msg: op + ": " + err.Error()}
	case errors.Is(err, mechanism.ErrInvalid):
		return &sandbox.InvalidError{Reason: op, Msg: err.Error()}
	case errors.Is(err, mechanism.ErrNotFound):
		return sandbox.ErrNotFound
	case errors.As(err, &se):
		if strings.Contains(se.Msg, "capability unavailable") {
			return &sandbox.InvalidError{Reason: "capability_unavailable", Msg: op + ": " + se.Msg}
		}
	}
	return &sandbox.ProviderError{Provider: Name, Reason: op, Err: err}
}

// Get reports the sandbox's state from the kernel and the supervisor.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	r, dir, err := p.handle(h)
	if err != nil {
		return sandbox.Info{}, err
	}
	raw := map[string]any{"name": r.Name, "mechanism": r.Mechanism, "created_at": r.CreatedAt, "limits": limitsJSON(r.Limits)}
	if len(r.Env) > 0 {
		raw["env"] = r.Env
	}
	if r.Dir != "" {
		raw["dir"] = r.Dir
	}
	if len(r.Labels) > 0 {
		raw["labels"] = r.Labels
	}
	if len(r.Mounts) > 0 {
		raw["mounts"] = mountsJSON(r.Mounts)
	}
	if r.Fresh {
		raw["id"] = r.InstanceID
	}
	policyJSON(r, dir, raw) // network.go
	status := sandbox.StatusUnknown
	pid, perr := supervisor.Client{Dir: dir}.Ping(ctx)
	m, merr := p.mechFor(r)
	ms := mechanism.StatusUnknown
	if merr == nil {
		if s, err := m.Status(ctx, r.InstanceID); err == nil {
			ms = s
		}
	}
	raw["mechanism_status"] = ms
	diskUse(p.homeDir(r.InstanceID), raw) // quota.go
	_, suspended := os.Stat(filepath.Join(dir, supervisor.SuspendedName))
	switch {
	case errors.Is(perr, supervisor.ErrNoSupervisor) && r.Lazy && ms == mechanism.StatusRunning:
		status, raw["state"] = sandbox.StatusRunning, "running"
	case errors.Is(perr, supervisor.ErrNoSupervisor) && ms == mechanism.StatusRunning:
		// The supervisor died (kill -9) and the sandbox runs on without
		// it: a new supervisor adopts it (its sessions' orphaned
		// processes are killed; the sandbox's own go on), so what Get
		// says is true again. Were it left, Get would say stopped while
		// the sandbox's processes ran, unfrozen and unsupervised.
		if err := supervisor.Launch(ctx, dir, p.supEnv...); err != nil {
			status, raw["state"] = sandbox.StatusRunning, "running_unsupervised"
			raw["error"] = err.Error()
			break
		}
		raw["readopted"] = true
		if suspended == nil {
			status, raw["state"] = sandbox.StatusSuspended, "suspended"
		} else {
			status, raw["state"] = sandbox.StatusRunning, "running"
		}
		if pid, err := (supervisor.Client{Dir: dir}).Ping(ctx); err == nil {
			raw["supervisor_pid"] = pid
		}
	case errors.Is(perr, supervisor.ErrNoSupervisor):
		status, raw["state"] = sandbox.StatusSuspended, "stopped"
	case perr != nil:
		raw["state"] = "unknown"
	case suspended == nil:
		status, raw["state"] = sandbox.StatusSuspended, "suspended"
		raw["supervisor_pid"] = pid
	case ms == mechanism.StatusRunning:
		status, raw["state"] = sandbox.StatusRunning, "running"
		raw["supervisor_pid"] = pid
	case ms == mechanism.StatusStopped || ms == mechanism.StatusProvisioned:
		// The supervisor is up but the sandbox is not (its init was
		// killed): stopped, disk kept; the next Exec or Spawn starts it.
		status, raw["state"] = sandbox.StatusSuspended, "stopped"
		raw["supervisor_pid"] = pid
	default:
		raw["state"] = "unknown"
		raw["supervisor_pid"] = pid
	}
	b, _ := json.Marshal(raw)
	return sandbox.Info{Status: status, Raw: b}, nil
}

// Destroy removes the sandbox: its sessions, supervisor, mechanism
// resources and disk. Nil when it is already gone.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	return p.destroy(ctx, h.Name)
}

func (p *Provider) destroy(ctx context.Context, name string) error {
	r, dir, err := p.load(name)
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// The record is locked before it moves to tmp as the mark of this
	// Destroy (the lock is on the directory, and moves with it), so
	// Sweep leaves it alone however long the teardown takes.
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // destroyed concurrently
		}
		return stateErr("destroy", err)
	}
	defer unlock()
	trash := filepath.Join(p.state, "tmp", "trash-"+r.InstanceID+"-"+newID())
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // destroyed concurrently
		}
		return stateErr("destroy", err)
	}
	// The name is free from here on; tear the old incarnation down.
	c := supervisor.Client{Dir: trash}
	if pid, err := c.Ping(ctx); err == nil {
		sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		err := c.Shutdown(sctx, true)
		cancel()
		if err != nil && !errors.Is(err, supervisor.ErrNoSupervisor) {
			// A supervisor that cannot shut down is killed; the
			// mechanism's Destroy below releases the sandbox.
			p.log.Warn("supervisor shutdown failed; killing it", "sandbox", name, "pid", pid, "err", err)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// The journals go while the mechanism tears the sandbox down (its
	// wait for the init's end leaves a core idle); the record, the mark
	// Sweep finds, goes last, once the mechanism's sandbox and the
	// instance are gone. Whatever fails stays behind it for Sweep.
	trashed := make(chan struct{})
	go func() {
		defer close(trashed)
		ents, _ := os.ReadDir(trash)
		for _, e := range ents {
			if e.Name() != "meta.json" {
				_ = os.RemoveAll(filepath.Join(trash, e.Name()))
			}
		}
	}()
	m, err := p.mechFor(r)
	if err == nil {
		err = m.Destroy(ctx, r.InstanceID)
	}
	if err == nil {
		p.releaseImage(r.InstanceID)
		err = removeAll(ctx, p.instanceDir(r.InstanceID)) // a tree the sandbox made: as deep as it liked
	}
	<-trashed
	if err != nil {
		p.log.Warn("destroy left work for Sweep", "sandbox", name, "err", err)
		return nil // the name is free; the mark stays
	}
	_ = os.RemoveAll(trash)
	return nil
}

// DestroyOnce is one bounded deletion: Destroy under opts.Timeout, then a
// check that the name is gone. A timeout is Unavailable{delete_unconfirmed}.
func (p *Provider) DestroyOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.DestroyOnceOptions) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	if opts.Timeout < 0 {
		return sandbox.Invalid("timeout", "negative DestroyOnce timeout")
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	if err := p.destroy(ctx, h.Name); err != nil {
		return sandbox.Unavailable("delete_unconfirmed", err)
	}
	if _, _, err := p.load(h.Name); !errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.Unavailable("delete_unconfirmed", err)
	}
	return nil
}

// shutdownTimeout bounds a destroyed sandbox's supervisor shutdown.
const shutdownTimeout = 30 * time.Second

// ListAllNames lists every sandbox under the state directory.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(p.state, "sandboxes"))
	if err != nil {
		return nil, sandbox.Unavailable("state", err)
	}
	names := []string{}
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(p.state, "sandboxes", e.Name(), "meta.json")); err == nil {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// ensureRunning starts the sandbox's supervisor (and so the sandbox) when
// it is stopped, restarts the mechanism's sandbox when it stopped under a
// live supervisor, and continues it when it is suspended.
func (p *Provider) ensureRunning(ctx context.Context, r *record, dir string) error {
	if err := supervisor.Launch(ctx, dir, p.supEnv...); err != nil {
		return mechErr("start", err)
	}
	if m, err := p.mechFor(r); err == nil {
		if st, err := m.Status(ctx, r.InstanceID); err == nil && (st == mechanism.StatusStopped || st == mechanism.StatusProvisioned) {
			if err := (supervisor.Client{Dir: dir}).Start(ctx); err != nil {
				return supErr(err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedName)); err == nil {
		if err := (supervisor.Client{Dir: dir}).Resume(ctx); err != nil {
			return supErr(err)
		}
	}
	return nil
}

// execDirect reports whether Exec may go straight to the mechanism: a
// lazily created sandbox that is not suspended. Its mechanism sandbox
// usually runs; when it does not, Execute says so (ErrNotRunning, before
// anything starts) and exec starts it, as Spawn does: no Status round
// trip to the init on every command.
func execDirect(r *record, dir string) bool {
	if !r.Lazy {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, supervisor.SuspendedName))
	return errors.Is(err, os.ErrNotExist)
}

// supErr maps a supervisor client error into the taxonomy.
func supErr(err error) error {
	var se *supervisor.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, supervisor.ErrNoSupervisor):
		return sandbox.Unavailable("supervisor_gone", err)
	case errors.As(err, &se):
		switch se.Code {
		case supervisor.CodeNotFound:
			return sandbox.ErrNotFound
		case supervisor.CodeExited:
			return sandbox.ErrCommandExited
		case supervisor.CodeStdinClosed:
			return &sandbox.WriteFailedError{Err: err}
		case supervisor.CodeInvalid:
			return sandbox.Invalid("request", se.Msg)
		case supervisor.CodeCouldNotRun:
			return &sandbox.InvalidError{Reason: "could_not_run", Msg: se.Msg}
		case supervisor.CodeUnsupported:
			return sandbox.ErrNotSupported
		case supervisor.CodeUnconfirmed:
			return sandbox.Unavailable(sandbox.ReasonTerminationUnconfirm, err)
		case supervisor.CodeUnavailable:
			return sandbox.Unavailable("supervisor", err)
		case supervisor.CodeNotRunning:
			return sandbox.Unavailable("not_running", err)
		}
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "supervisor", Err: err}
}

// Suspend freezes the sandbox's processes (or stops its sessions', see the
// package doc), keeping them and the disk; Resume continues them. A
// stopped sandbox is already parked.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	r, dir, err := p.handle(h)
	if err != nil {
		return err
	}
	err = supervisor.Client{Dir: dir}.Suspend(ctx)
	if errors.Is(err, supervisor.ErrNoSupervisor) && r.Lazy {
		// A lazily created sandbox runs without a supervisor: start one
		// so the suspension is recorded and undone by Resume.
		if err := supervisor.Launch(ctx, dir, p.supEnv...); err != nil {
			return mechErr("start", err)
		}
		err = supervisor.Client{Dir: dir}.Suspend(ctx)
	}
	if errors.Is(err, supervisor.ErrNoSupervisor) {
		return nil
	}
	return supErr(err)
}

// Resume starts or continues the sandbox and returns a usable handle.
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	r, dir, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	if err := p.ensureRunning(ctx, r, dir); err != nil {
		return nil, err
	}
	return h, nil
}

// PublicURL is http://127.0.0.1:PORT where the sandbox's first published
// port is on this machine's loopback, for this user only (network.go);
// ErrUnsupported on a mechanism that publishes nothing.
func (p *Provider) PublicURL(ctx context.Context, h *sandbox.Handle) (string, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return "", err
	}
	return p.publicURL(ctx, r)
}

// ApplyNetworkPolicy replaces the sandbox's egress allowlist through the
// mechanism; Allow [] is deny-all.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	r, dir, err := p.handle(h)
	if err != nil {
		return err
	}
	m, err := p.mechFor(r)
	if err != nil {
		return mechErr("policy", err)
	}
	if _, ok := m.(mechanism.EgressUpdater); !ok {
		return sandbox.ErrNotSupported
	}
	if err := checkPolicy(pol.Allow); err != nil {
		return err // before a stopped sandbox is started for it
	}
	if err := p.ensureRunning(ctx, r, dir); err != nil {
		return err
	}
	allow := pol.Allow
	if allow == nil {
		allow = []string{}
	}
	if err := checkPolicy(allow); err != nil {
		return err
	}
	if err := mechanism.UpdateEgress(ctx, m, r.InstanceID, egressEntries(allow)); err != nil {
		return mechErr("policy", err)
	}
	b, _ := json.Marshal(allow)
	if err := os.WriteFile(filepath.Join(dir, policyName), b, 0o600); err != nil {
		return stateErr("policy", err)
	}
	return nil
}

// Spawn starts a detachable session and returns once its process started.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	r, dir, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, sandbox.Invalid("command", "empty command name")
	}
	m, err := p.mechFor(r)
	if err != nil {
		return nil, mechErr("spawn", err)
	}
	if p.directOK(r, dir, opts) {
		cmd, err := p.spawnDirect(ctx, r, m, c, opts)
		if !errors.Is(err, mechanism.ErrNotRunning) {
			return cmd, err
		}
	}
	argv, env := p.command(r, m, c.Argv(), opts.Env)
	req := supervisor.SpawnRequest{Argv: argv, Env: env, Dir: r.dir(opts.Dir), Stdin: opts.Stdin, Command: c.String(),
		TTY: opts.TTY, Rows: opts.TTYRows, Cols: opts.TTYCols, Budget: r.Limits.WallClock}
	// Optimistic: a running sandbox's supervisor takes the spawn at once
	// (it resumes a suspended sandbox itself), on the connection that then
	// follows the output. Only a failure that means nothing started
	// because the sandbox does not run (no supervisor listens, or it says
	// its sandbox is not running) takes ensureRunning's path and asks again.
	conn, id, err := p.trySpawn(ctx, dir, req)
	if err != nil && p.spawnRetry(ctx, r, m, err) {
		if err := p.ensureRunning(ctx, r, dir); err != nil {
			return nil, err
		}
		conn, id, err = p.trySpawn(ctx, dir, req)
	}
	if err != nil {
		return nil, supErr(err)
	}
	return p.followOn(dir, conn, id, opts.Stdin || opts.TTY), nil
}

// trySpawn dials the sandbox's supervisor and asks it to spawn; the
// connection is returned open for the follow.
func (p *Provider) trySpawn(ctx context.Context, dir string, req supervisor.SpawnRequest) (*supervisor.Conn, string, error) {
	conn, err := supervisor.Client{Dir: dir}.Dial(ctx)
	if err != nil {
		return nil, "", err
	}
	id, err := conn.Spawn(ctx, req)
	if err != nil {
		conn.Close()
		return nil, "", err
	}
	return conn, id, nil
}

// spawnRetry reports whether a failed spawn surely started nothing
// because the sandbox does not run, so that it may be asked again once
// ensureRunning started it: no supervisor listened (the dial's own
// ErrNoSupervisor, nothing sent; a connection lost after the request is
// not this), or the supervisor said not_running. An unavailable answer
// (a supervisor of an older binary says so of a stopped sandbox) counts
// only while the mechanism says the sandbox is stopped.
func (p *Provider) spawnRetry(ctx context.Context, r *record, m mechanism.Mechanism, err error) bool {
	if err == supervisor.ErrNoSupervisor {
		return true
	}
	var se *supervisor.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code {
	case supervisor.CodeNotRunning:
		return true
	case supervisor.CodeUnavailable:
		st, serr := m.Status(ctx, r.InstanceID)
		return serr == nil && (st == mechanism.StatusStopped || st == mechanism.StatusProvisioned)
	}
	return false
}

// cmdState is a Command's private state.
type cmdState struct {
	dir    string
	id     string
	stdin  bool
	cancel context.CancelFunc
}

// follow returns a Command fed from session id's journal from byte zero.
func (p *Provider) follow(dir, id string, stdin bool) *sandbox.Command {
	return p.followOn(dir, nil, id, stdin)
}

// followOn is follow on conn (nil: a connection of its own), which the
// follow closes when it ends.
func (p *Provider) followOn(dir string, conn *supervisor.Conn, id string, stdin bool) *sandbox.Command {
	ctx, cancel := context.WithCancel(context.Background())
	st := &cmdState{dir: dir, id: id, stdin: stdin, cancel: cancel}
	cmd, stream := sandbox.NewCommand(p, "", st)
	cmd.SessionID = id
	go func() {
		defer cancel()
		out, err := supervisor.Client{Dir: dir}.FollowOn(ctx, conn, id, func(r journal.Record) bool {
			// The journal is the buffer: a reader that falls behind
			// pauses the reading, never drops the reader as slow.
			if !stream.WaitRoom(ctx, len(r.Data)) {
				return false
			}
			if r.Kind == journal.KindStderr {
				return stream.Stderr(r.Data)
			}
			return stream.Stdout(r.Data)
		})
		switch {
		case err != nil && ctx.Err() != nil:
			// stopped locally
		case err != nil:
			stream.Fail(supErr(err))
		case out.Exited:
			stream.Exit(out.Code)
		default:
			stream.Fail(sandbox.ClosedBeforeExit())
		}
	}()
	return cmd
}

func commandState(c *sandbox.Command) (*cmdState, error) {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return nil, err
	}
	st, ok := c.Private.(*cmdState)
	if !ok || st == nil {
		return nil, sandbox.Invalid(sandbox.ReasonHandle, "command has no local session")
	}
	return st, nil
}

// WriteStdin writes to the session's stdin.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	if d, ok := c.Private.(*directState); ok && c.Provider == Name {
		return d.write(data)
	}
	st, err := commandState(c)
	if err != nil {
		return err
	}
	if !st.stdin {
		return &sandbox.WriteFailedError{Err: errors.New("local: command was attached without stdin")}
	}
	err = supervisor.Client{Dir: st.dir}.WriteStdin(ctx, st.id, data)
	if errors.Is(err, supervisor.ErrNoSupervisor) {
		return sandbox.ErrCommandExited
	}
	return supErr(err)
}

// CloseStdin closes the session's stdin.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	if d, ok := c.Private.(*directState); ok && c.Provider == Name {
		d.closeStdin()
		return nil
	}
	st, err := commandState(c)
	if err != nil {
		return err
	}
	err = supervisor.Client{Dir: st.dir}.CloseStdin(ctx, st.id)
	var se *supervisor.Error
	if errors.Is(err, supervisor.ErrNoSupervisor) || (errors.As(err, &se) && se.Code == supervisor.CodeExited) {
		return nil // nothing left to close
	}
	return supErr(err)
}

// StopCommand detaches this process from the session; the session runs on.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if d, ok := c.Private.(*directState); ok && c != nil {
		// A direct process lives only as long as its caller attends to it.
		_ = d.proc.Signal(syscall.SIGKILL)
		d.closeStdin()
		return nil
	}
	if st, err := commandState(c); err == nil {
		st.cancel()
	}
	return nil
}

// ListSessions lists the sandbox's sessions, finished ones included.
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	_, dir, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	ms, err := supervisor.ReadSessions(dir)
	if err != nil {
		return nil, sandbox.Unavailable("state", err)
	}
	out := make([]sandbox.Session, 0, len(ms))
	for _, m := range ms {
		s := sandbox.Session{ID: m.ID, Command: m.Command, CreatedAt: m.CreatedAt, TTY: m.TTY}
		s.State, s.ExitCode = supervisor.SessionState(dir, m.ID)
		if st, err := os.Stat(supervisor.JournalPath(dir, m.ID)); err == nil {
			s.LastActivityAt = st.ModTime().UTC()
		}
		out = append(out, s)
	}
	return out, nil
}

// Attach replays session id from byte zero, then tails it.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, id string, opts sandbox.AttachOptions) (*sandbox.Command, error) {
	_, dir, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(id); err != nil {
		return nil, err
	}
	if !supervisor.HasSession(dir, id) {
		return nil, sandbox.ErrNotFound
	}
	if why, pruned := supervisor.Pruned(dir, id); pruned {
		return nil, fmt.Errorf("session %s's output was pruned by the sandbox's journal retention (%s): %w", id, why, sandbox.ErrNotFound)
	}
	return p.follow(dir, id, opts.Stdin), nil
}

// TerminateSession stops one session (SIGTERM, SIGKILL after the grace;
// Force: SIGKILL at once) and returns once its process was reaped. The
// sandbox and its other sessions stay.
func (p *Provider) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, opts sandbox.TerminateOptions) error {
	opts, err := sandbox.ValidateTermination(id, opts)
	if err != nil {
		return err
	}
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	absent := func() error {
		if opts.Mode == sandbox.Force {
			return sandbox.Unavailable(sandbox.ReasonTerminationUnconfirm, fmt.Errorf("local: no session %q on %s", id, h.Name))
		}
		return nil
	}
	_, dir, err := p.load(h.Name)
	if errors.Is(err, sandbox.ErrNotFound) {
		return absent()
	}
	if err != nil {
		return err
	}
	if !supervisor.HasSession(dir, id) {
		return absent()
	}
	err = supervisor.Client{Dir: dir}.Terminate(ctx, id, opts.Mode == sandbox.Force, opts.Timeout)
	if errors.Is(err, supervisor.ErrNoSupervisor) {
		supervisor.KillOrphan(dir, id)
		return nil
	}
	var se *supervisor.Error
	if errors.As(err, &se) && se.Code == supervisor.CodeNotFound {
		return absent()
	}
	return supErr(err)
}

// Exec runs c to completion in the sandbox.
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		return p.exec(ctx, h, c, opts)
	})
}

func (p *Provider) exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	r, dir, err := p.load(h.Name)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	if c.Name == "" {
		return sandbox.ExecResult{}, sandbox.Invalid("command", "empty command name")
	}
	m, err := p.mechFor(r)
	if err != nil {
		return sandbox.ExecResult{}, mechErr("exec", err)
	}
	direct := execDirect(r, dir)
	if !direct {
		if err := p.ensureRunning(ctx, r, dir); err != nil {
			return sandbox.ExecResult{}, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd, stream := sandbox.NewCommand(p, "", nil)
	argv, env := p.command(r, m, c.Argv(), opts.Env)
	eo := mechanism.ExecOptions{Env: env, Dir: r.dir(opts.Dir), LimitBytes: 1,
		OnOutput: func(s mechanism.Stream, chunk []byte) {
			if s == mechanism.Stderr {
				stream.Stderr(chunk)
			} else {
				stream.Stdout(chunk)
			}
		}}
	if d, ok := ctx.Deadline(); ok {
		eo.Timeout = time.Until(d)
		if eo.Timeout <= 0 {
			return sandbox.ExecResult{}, sandbox.ExecTimeout(opts.Timeout)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		comp, err := m.Execute(ctx, r.InstanceID, argv, eo)
		if direct && errors.Is(err, mechanism.ErrNotRunning) {
			// Nothing ran: start the sandbox and try once more.
			if err := p.ensureRunning(ctx, r, dir); err != nil {
				stream.Fail(err)
				return
			}
			if d, ok := ctx.Deadline(); ok {
				eo.Timeout = time.Until(d)
			}
			comp, err = m.Execute(ctx, r.InstanceID, argv, eo)
		}
		var le *mechanism.LimitExceededError
		switch {
		case err == nil:
			stream.Exit(comp.ExitStatus)
		case errors.As(err, &le) && le.Limit == mechanism.LimitWallClock:
			budget := opts.Timeout
			if budget <= 0 {
				budget = r.Limits.WallClock
			}
			stream.Fail(sandbox.ExecTimeout(budget))
		case errors.As(err, &le):
			stream.Exit(comp.ExitStatus)
		case ctx.Err() != nil:
			stream.Fail(sandbox.ExecTimeout(opts.Timeout))
		case errors.Is(err, mechanism.ErrNotRunning), errors.Is(err, mechanism.ErrNotFound), errors.Is(err, mechanism.ErrInterrupted):
			stream.Fail(sandbox.Unavailable("not_running", err))
		case errors.Is(err, mechanism.ErrCouldNotRun):
			stream.Fail(&sandbox.InvalidError{Reason: "could_not_run", Msg: err.Error()})
		default:
			stream.Fail(&sandbox.ProviderError{Provider: Name, Reason: "exec", Err: err})
		}
	}()
	res, err := sandbox.CollectExecMax(ctx, cmd, opts.StderrToStdout, opts.Timeout, opts.MaxOutput, nil)
	cancel()
	<-done
	_ = cmd.Stop()
	return res, err
}
