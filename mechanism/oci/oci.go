package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
)

// UID and GID are the ids the workload runs as, inside the container and
// (there being no user namespace) on the host: the "sprite" user of the
// container's /etc/passwd. Files a caller writes into the home directory
// through HostPath should be chowned to them.
const (
	UID = 1000
	GID = 1000
)

// Config configures a Mechanism.
type Config struct {
	// Runtime is the OCI runtime: "runc" (the default), "runsc" (gVisor),
	// or a path to a runtime binary with runc's command line (a basename
	// containing "runsc" is driven as gVisor).
	Runtime string
	// StateDir holds the runtime's state (its --root) and the sandboxes'
	// bundles and home directories; it survives restarts of the managing
	// process. Default /var/lib/managoat/oci.
	StateDir string
	// Prober answers the Gate's host probes; default mechanism.HostProber().
	Prober mechanism.Prober
	// Egress is how runc containers whose network is egress reach the
	// outside world (default: from this process's network namespace;
	// a test gives a stand-in, mechanism/egress/egresstest).
	Egress egress.Config
}

// Mechanism is a mechanism.Mechanism that runs each sandbox as a container
// of an OCI runtime driven through its command line.
type Mechanism struct {
	cfg      Config
	rt       runtimeInfo
	base     string // <StateDir>/<runtime name>
	root     string // the runtime's --root
	prober   mechanism.Prober
	mu       sync.Mutex
	rootfsMu sync.Mutex
	locks    map[string]*sync.Mutex
	booting  map[string]bool
	nets     egress.Served // egress proxies and published ports this process serves (network.go, address.go)
}

var _ mechanism.Mechanism = (*Mechanism)(nil)

// New returns a Mechanism for cfg. A runtime that is not installed is not
// an error here: Provision refuses, naming the runtime and how to install
// it (so a doctor and a CLI can construct every mechanism).
func New(cfg Config) (*Mechanism, error) {
	if cfg.Runtime == "" {
		cfg.Runtime = "runc"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/var/lib/managoat/oci"
	}
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, mechanism.Invalid("StateDir", "not an absolute path")
	}
	if cfg.Prober == nil {
		cfg.Prober = mechanism.HostProber()
	}
	rt := resolveRuntime(cfg.Runtime)
	m := &Mechanism{
		cfg:     cfg,
		rt:      rt,
		base:    filepath.Join(cfg.StateDir, rt.name),
		prober:  cfg.Prober,
		locks:   map[string]*sync.Mutex{},
		booting: map[string]bool{},
	}
	m.root = filepath.Join(m.base, "root")
	for _, d := range []string{m.root, filepath.Join(m.base, "sandboxes"), filepath.Join(m.base, "tmp")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("oci: state dir: %w", err)
		}
	}
	return m, nil
}

// Name implements mechanism.Mechanism: "oci/runc", "oci/runsc", or
// "oci/<basename>" for a runtime given by path.
func (m *Mechanism) Name() string { return "oci/" + m.rt.name }

// Runtime returns the runtime's name and the path it resolved to ("" when
// it is not installed).
func (m *Mechanism) Runtime() (name, path string) { return m.rt.name, m.rt.path() }

// constructed is what the container builds whatever the host offers: its
// own pid, mount, network, ipc and uts namespaces, a read-only root with
// the workload as an unprivileged uid without capabilities under
// no_new_privs, a seccomp filter, and the mechanism's own wall-clock
// budget.
var constructed = []mechanism.Capability{
	mechanism.ProcessSeparation, mechanism.FilesystemConfinement, mechanism.PrivilegeSeparation,
	mechanism.NetworkRestriction, mechanism.SyscallFilter,
}

// RequiredCapabilities: exactly what the container constructs (so the host
// is probed for nothing but the cgroup controllers a Spec's limits need,
// which the gate adds). Landlock and disk_quota are not required: the
// container does not use them.
func (m *Mechanism) RequiredCapabilities() []mechanism.Capability {
	return slices.Clone(constructed)
}

// ConstructedCapabilities implements mechanism.CapabilityConstructor.
func (m *Mechanism) ConstructedCapabilities() []mechanism.Capability {
	c := append(slices.Clone(constructed), mechanism.TimeBudget, mechanism.HostMounts) // mounts.go
	if m.egressOK() {
		c = append(c, mechanism.EgressAllowlist) // network.go
	}
	return append(c, m.quotaCaps()...) // disk_quota where the host allows it (quota.go)
}

// GuaranteedCapabilities: the isolation, the CPU quota and the wall-clock
// budget; memory and pids caps on runc but not on gVisor (see the package
// doc for why), so a Spec asking runsc for them is refused.
func (m *Mechanism) GuaranteedCapabilities() []mechanism.Capability {
	g := append(slices.Clone(constructed), mechanism.CPUCap, mechanism.TimeBudget, mechanism.HostMounts)
	if !m.rt.gvisor {
		g = append(g, mechanism.ResourceLimits, mechanism.MemoryCap, mechanism.PidsCap)
	}
	if m.egressOK() {
		g = append(g, mechanism.EgressAllowlist)
	}
	return append(g, m.quotaCaps()...) // quota.go
}

// Owner returns the host uid and gid the workload's files are owned by.
func (m *Mechanism) Owner() (uid, gid int) { return UID, GID }

// sandbox is what the mechanism keeps of a sandbox on disk (spec.json).
type sandbox struct {
	Mechanism string         `json:"mechanism"`
	ID        string         `json:"id"`
	Spec      mechanism.Spec `json:"spec"`
	HomeDir   string         `json:"homeDir"`
	OwnHome   bool           `json:"ownHome"`
	Cgroup    string         `json:"cgroup"`
}

func (m *Mechanism) dir(id string) string    { return filepath.Join(m.base, "sandboxes", id) }
func (m *Mechanism) bundle(id string) string { return filepath.Join(m.dir(id), "bundle") }

// cgroupName is the container's cgroup path, relative to the cgroup of the
// runtime process (so under the managing process's own cgroup).
func (m *Mechanism) cgroupName(id string) string { return "managoat-oci-" + m.rt.name + "-" + id }

// open is the sandbox id after checking the id: ErrNotFound when it has no
// state here.
func (m *Mechanism) open(id string) (*sandbox, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return nil, err
	}
	sb, err := m.load(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
	}
	return sb, err
}

func (m *Mechanism) load(id string) (*sandbox, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(id), "spec.json"))
	if err != nil {
		return nil, err
	}
	var sb sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		return nil, fmt.Errorf("oci: %s/spec.json: %w", m.dir(id), err)
	}
	return &sb, nil
}

func (m *Mechanism) lock(id string) func() {
	m.mu.Lock()
	l := m.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func normSpec(s mechanism.Spec) mechanism.Spec {
	if len(s.Egress) == 0 {
		s.Egress = nil
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	return s
}

// refuseRuntime is the refusal when the runtime is not installed.
func (m *Mechanism) refuseRuntime() error {
	if m.rt.path() != "" {
		return nil
	}
	detail := fmt.Sprintf("OCI runtime %s is not installed (%s)", m.rt.name, m.rt.installHint())
	var missing []mechanism.Report
	for _, c := range constructed {
		missing = append(missing, mechanism.Report{Name: c, Detail: detail})
	}
	return &mechanism.UnavailableError{Mechanism: m.Name(), Missing: missing}
}

// refuseLimits refuses a Spec limit gVisor cannot keep, with the reason
// (the generic gate would only say "not enforced").
func (m *Mechanism) refuseLimits(spec mechanism.Spec) error {
	if !m.rt.gvisor {
		return nil
	}
	var missing []mechanism.Report
	if spec.MemoryBytes > 0 {
		missing = append(missing, mechanism.Report{Name: mechanism.MemoryCap, Detail: "not enforced by oci/runsc: under gVisor's ptrace platform the workload's memory is charged to the sentry, so a breach OOM-kills the whole sandbox instead of the allocating process"})
	}
	if spec.Pids > 0 {
		missing = append(missing, mechanism.Report{Name: mechanism.PidsCap, Detail: "not enforced by oci/runsc: gVisor's tasks are not host processes, so pids.max does not count them"})
	}
	if len(missing) == 0 {
		return nil
	}
	return &mechanism.UnavailableError{Mechanism: m.Name(), Missing: missing}
}

// Provision implements mechanism.Mechanism: it runs the gate, writes the
// bundle and has the runtime create the container (not started).
func (m *Mechanism) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := validateNetwork(spec); err != nil {
		return err
	}
	if err := m.refusePublish(spec); err != nil {
		return err
	}
	// Sources resolved once, here (mounts.go); spec.json keeps the result.
	mounts, err := mechanism.ResolveMounts(spec.Mounts)
	if err != nil {
		return err
	}
	spec.Mounts = mounts
	unlock := m.lock(id)
	defer unlock()
	if sb, err := m.load(id); err == nil {
		if !reflect.DeepEqual(normSpec(sb.Spec), normSpec(spec)) {
			return fmt.Errorf("%w: %s", mechanism.ErrExists, id)
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := m.refuseRuntime(); err != nil {
		return err
	}
	if err := m.refuseLimits(spec); err != nil {
		return err
	}
	if err := mechanism.Gate(ctx, m, spec, m.prober); err != nil {
		return err
	}
	if _, err := os.Lstat(m.dir(id)); err == nil {
		// A sandbox directory without its record: a destroy cut short.
		if err := m.deleteContainer(ctx, id); err != nil {
			return err
		}
		if err := removeAll(m.dir(id)); err != nil {
			return err
		}
	}
	sb := &sandbox{Mechanism: m.Name(), ID: id, Spec: normSpec(spec), HomeDir: spec.HomeDir, Cgroup: m.cgroupName(id)}
	if err := m.writeSandbox(sb); err != nil {
		return err
	}
	err = m.create(ctx, sb)
	if err != nil {
		// A container of this id without a sandbox directory is what a
		// destroy cut short leaves: remove it and try once more.
		if _, serr := m.state(ctx, id); serr == nil {
			if m.deleteContainer(ctx, id) == nil {
				err = m.create(ctx, sb)
			}
		}
	}
	if err != nil {
		m.remove(context.Background(), sb)
		return err
	}
	return nil
}

// writeSandbox builds the sandbox directory under a temporary name and
// renames it into place, so a half-built sandbox is never seen.
func (m *Mechanism) writeSandbox(sb *sandbox) (err error) {
	tmp, err := os.MkdirTemp(filepath.Join(m.base, "tmp"), "provision-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	final := m.dir(sb.ID)
	if sb.HomeDir == "" {
		sb.OwnHome = true
		sb.HomeDir = filepath.Join(final, "home")
		if err := os.Mkdir(filepath.Join(tmp, "home"), 0o750); err != nil {
			return err
		}
		if err := os.Chown(filepath.Join(tmp, "home"), UID, GID); err != nil {
			return err
		}
	} else if st, err := os.Stat(sb.HomeDir); err != nil || !st.IsDir() {
		return mechanism.Invalid("HomeDir", fmt.Sprintf("%s is not a directory", sb.HomeDir))
	}
	var h hostLayout
	var rootfs string
	if sb.Spec.Image != nil {
		// The image's root, not the host's (image.go).
		rootfs = filepath.Join(final, "rootfs")
		err = prepareImage(tmp, sb.Spec.Image)
	} else {
		h = scanHost()
		rootfs, err = m.rootfsFor(h, sb.Spec) // mounts.go
	}
	if err != nil {
		return err
	}
	if err := writeBundle(filepath.Join(tmp, "bundle"), rootfs, h, sb, m.rt); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(sb, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "spec.json"), b, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o711); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("oci: place sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// create has the runtime create the container from the bundle.
func (m *Mechanism) create(ctx context.Context, sb *sandbox) error {
	logPath := filepath.Join(m.dir(sb.ID), "console.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	pidFile := filepath.Join(m.dir(sb.ID), "init.pid")
	_ = os.Remove(pidFile)
	if err := m.mountHome(ctx, sb); err != nil { // quota.go
		return err
	}
	if err := m.mountImage(sb); err != nil {
		return err
	}
	if err := m.prepareMounts(sb); err != nil { // mounts.go
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, runtimeTimeout)
		defer cancel()
	}
	cmd := m.command(ctx, m.withNet(sb.Spec, "create", "--bundle", m.bundle(sb.ID), "--pid-file", pidFile, sb.ID)...)
	// The container's init inherits create's stdio: a file, never a pipe
	// (a pipe would be held open by the container for its whole life).
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("oci: %s create %s: %v: %s", m.rt.name, sb.ID, err, lastLines(out))
	}
	return nil
}

// remove deletes the container, its cgroups and the sandbox directory.
func (m *Mechanism) remove(ctx context.Context, sb *sandbox) error {
	err := m.deleteContainer(ctx, sb.ID)
	m.removeCgroups(ctx, sb)
	if qerr := m.releaseHome(sb.ID); qerr != nil && err == nil { // quota.go
		err = qerr
	}
	unmountImage(m.dir(sb.ID))
	if rerr := removeAll(m.dir(sb.ID)); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		// A file made read-only by the workload; make it writable and retry.
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o700)
			}
			return nil
		})
		return os.RemoveAll(dir)
	}
	return nil
}

// removeCgroups removes what the runtime may have left of the container's
// cgroups (it normally removes them at delete).
func (m *Mechanism) removeCgroups(ctx context.Context, sb *sandbox) {
	l, err := mechanism.CgroupLayout()
	if err != nil || sb.Cgroup == "" {
		return
	}
	g := l.Open(sb.Cgroup)
	if g.Exists() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = g.Remove(ctx)
	}
}

// Start implements mechanism.Mechanism.
func (m *Mechanism) Start(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.open(id)
	if err != nil {
		return err
	}
	if err := m.refuseRuntime(); err != nil {
		return err
	}
	if err := m.refuseLimits(sb.Spec); err != nil {
		return err
	}
	if err := mechanism.Gate(ctx, m, sb.Spec, m.prober); err != nil {
		return err
	}
	m.setBooting(id, true)
	defer m.setBooting(id, false)
	// The common case is a created container (Provision, or a Start after
	// Stop that recreated it): start it at once and ask the runtime's state
	// only when that fails.
	if _, err := m.run(ctx, m.withNet(sb.Spec, "start", id)...); err != nil {
		st, serr := m.state(ctx, id)
		switch {
		case serr == nil && st.Status == "running":
			if pid, err := m.initPid(id); err == nil {
				return m.startNet(id, sb.Spec, pid) // a new manager adopts it
			}
			return nil
		case serr == nil && st.Status == "created":
			return err
		case serr == nil || errors.Is(serr, errNoContainer):
			if serr == nil {
				if derr := m.deleteContainer(ctx, id); derr != nil {
					return derr
				}
			}
			m.removeCgroups(ctx, sb)
			if err := m.create(ctx, sb); err != nil {
				return err
			}
			if _, err := m.run(ctx, m.withNet(sb.Spec, "start", id)...); err != nil {
				_ = m.deleteContainer(context.Background(), id)
				return err
			}
		default:
			return serr
		}
	}
	pid, err := m.initPid(id)
	if err == nil {
		err = m.verify(pid, sb.Spec)
	}
	if err == nil {
		err = m.startNet(id, sb.Spec, pid)
	}
	if err != nil {
		_ = m.deleteContainer(context.Background(), id)
		return err
	}
	return nil
}

// initPid is the host pid of the container's init (or of gVisor's
// sandbox), written by the runtime at create.
func (m *Mechanism) initPid(id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(id), "init.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("oci: bad init.pid %q", b)
	}
	return pid, nil
}

// cgroupOf returns the running container's cgroup, or nil when its init
// is gone (or the pid now belongs to a process outside the container).
func (m *Mechanism) cgroupOf(sb *sandbox) *ccgroup {
	pid, err := m.initPid(sb.ID)
	if err != nil {
		return nil
	}
	cg, err := containerCgroup(pid)
	if err != nil {
		return nil
	}
	for _, d := range cg.v1 {
		if filepath.Base(d) == sb.Cgroup {
			return cg
		}
	}
	if filepath.Base(cg.v2) == sb.Cgroup {
		return cg
	}
	return nil
}

func (m *Mechanism) setBooting(id string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if on {
		m.booting[id] = true
	} else {
		delete(m.booting, id)
	}
}

// Stop implements mechanism.Mechanism: the container is killed and deleted
// (releasing its cgroups); the bundle and home stay, so Start recreates it.
func (m *Mechanism) Stop(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.load(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := m.deleteContainer(ctx, id); err != nil {
		return err
	}
	m.stopNetwork(id)
	m.removeCgroups(ctx, sb)
	return nil
}

// Destroy implements mechanism.Mechanism.
func (m *Mechanism) Destroy(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.load(id)
	if errors.Is(err, fs.ErrNotExist) {
		// Nothing of ours; a container left by a crash between delete and
		// removal is still deleted.
		if m.rt.path() != "" {
			if _, serr := m.state(ctx, id); serr == nil {
				return m.deleteContainer(ctx, id)
			}
		}
		if err := m.releaseHome(id); err != nil { // quota.go
			return err
		}
		unmountImage(m.dir(id))
		return removeAll(m.dir(id))
	}
	if err != nil {
		return err
	}
	err = m.remove(ctx, sb)
	m.stopNetwork(id)
	return err
}

// Status implements mechanism.Mechanism. The runtime's state is the truth;
// a container the runtime does not know is stopped when the sandbox's
// bundle is there (Stop deletes the container) and absent otherwise. A
// runtime that cannot answer, or answers a state this mechanism does not
// know, is StatusUnknown.
func (m *Mechanism) Status(ctx context.Context, id string) (mechanism.Status, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return mechanism.StatusAbsent, err
	}
	_, lerr := m.load(id)
	have := lerr == nil
	if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
		return mechanism.StatusUnknown, nil
	}
	m.mu.Lock()
	booting := m.booting[id]
	m.mu.Unlock()
	if m.rt.path() == "" {
		if have {
			return mechanism.StatusUnknown, nil
		}
		return mechanism.StatusAbsent, nil
	}
	st, err := m.state(ctx, id)
	switch {
	case errors.Is(err, errNoContainer):
		if booting {
			return mechanism.StatusStarting, nil
		}
		if have {
			return mechanism.StatusStopped, nil
		}
		return mechanism.StatusAbsent, nil
	case err != nil:
		return mechanism.StatusUnknown, nil
	}
	s := mapStatus(st.Status)
	if booting && (s == mechanism.StatusProvisioned || s == mechanism.StatusStopped) {
		return mechanism.StatusStarting, nil
	}
	if !have && s != mechanism.StatusUnknown {
		// A container in our root without our sandbox directory: a
		// destroy was cut short. Report what the runtime says.
		return s, nil
	}
	return s, nil
}

// mapStatus maps an OCI runtime state to a mechanism.Status.
func mapStatus(s string) mechanism.Status {
	switch s {
	case "creating":
		return mechanism.StatusStarting
	case "created":
		return mechanism.StatusProvisioned
	case "running", "paused": // paused by Freeze: its processes are kept
		return mechanism.StatusRunning
	case "stopped":
		return mechanism.StatusStopped
	}
	return mechanism.StatusUnknown
}

// ListRunning implements mechanism.Mechanism from the runtime's own list
// (in this mechanism's --root), keeping containers whose bundle is one of
// this mechanism's.
func (m *Mechanism) ListRunning(ctx context.Context) ([]string, error) {
	if m.rt.path() == "" {
		// Nothing can run without the runtime, unless it was removed
		// under sandboxes this mechanism made: then it cannot see.
		if ents, _ := os.ReadDir(filepath.Join(m.base, "sandboxes")); len(ents) > 0 {
			return nil, m.refuseRuntime()
		}
		return []string{}, nil
	}
	list, err := m.list(ctx)
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, c := range list {
		if mapStatus(c.Status) != mechanism.StatusRunning || mechanism.ValidateID(c.ID) != nil {
			continue
		}
		if filepath.Clean(c.Bundle) != m.bundle(c.ID) {
			continue
		}
		out = append(out, c.ID)
	}
	return out, nil
}

// Usage implements mechanism.Mechanism from the container's cgroup (CPU
// time, the CPU rate over mechanism.UsageWindow, memory) and the home
// directory's allocated blocks.
func (m *Mechanism) Usage(ctx context.Context, id string) (mechanism.Usage, error) {
	sb, err := m.open(id)
	if err != nil {
		return mechanism.Usage{}, err
	}
	var u mechanism.Usage
	u.DiskBytes = diskUsage(sb.HomeDir)
	st, err := m.state(ctx, id)
	if err != nil || st.Status != "running" {
		return u, fmt.Errorf("%w: %s", mechanism.ErrNotRunning, id)
	}
	cg, err := containerCgroup(st.Pid)
	if err != nil {
		return u, err
	}
	rate, cpu, err := mechanism.CPURate(ctx, func() (time.Duration, bool) { return cg.stats().cpu, true })
	if err != nil {
		return u, err
	}
	u.CPUTime, u.CPUMillicores, u.MemoryBytes = cpu, rate, cg.stats().memory
	return u, nil
}

func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += allocated(info)
		}
		return nil
	})
	return n
}

// HostPath implements mechanism.Mechanism.
func (m *Mechanism) HostPath(id, sandboxPath string) (string, error) {
	sb, err := m.open(id)
	if err != nil {
		return "", err
	}
	if err := m.ensureHome(id); err != nil { // a home a reboot unmounted (quota.go)
		return "", err
	}
	return mechanism.ResolveHome(sb.HomeDir, sandboxPath)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
