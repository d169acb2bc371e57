package jail

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// Config configures a Jail.
type Config struct {
	// StateDir holds one directory per sandbox (state, home, and the Go
	// init's log).
	// Required. Two Jails with different StateDirs never see each other's
	// sandboxes.
	StateDir string
	// RunDir holds the control sockets (their paths must stay short).
	// Default /run/managoat as root, else $XDG_RUNTIME_DIR/managoat, else
	// a per-uid directory under os.TempDir().
	RunDir string
	// Prober answers the gate; default mechanism.HostProber().
	Prober mechanism.Prober
	// TemplateDir, when set, keeps the tree template (the part of every
	// sandbox's root that is the same for all) for other processes: the
	// first start of every process then clones it instead of building
	// its tree. It must be a directory only root can write, on a file
	// system that is cleared at boot (/run). Empty: the template lives in
	// this process only, built after its second start.
	TemplateDir string
	// UID and GID the workload runs as when the manager is root (default
	// 1000:1000, the "sprite" user of the sandbox's /etc/passwd). Without
	// root the workload is uid 0 of a user namespace mapped to the caller.
	UID, GID int
	// IDMapDir is where, as root, each sandbox's uid/gid range is
	// claimed (userns.go): host-wide, so that no two sandboxes of any
	// StateDir share one. Default DefaultIDMapDir; "-" gives sandboxes
	// provisioned from then on no range of their own (they run as
	// Config.UID on the host, as before ranges existed).
	IDMapDir string
	// UnmappedMounts lets a sandbox with a host mount that cannot be
	// idmapped (its file system lacks it here: mounts.go) run without a
	// uid range of its own, its workload Config.UID on the host, instead
	// of being refused at Provision. New sets it when the environment has
	// MANAGOAT_JAIL_UNMAPPED_MOUNTS=1.
	UnmappedMounts bool
	// Egress is how sandboxes whose network is egress reach the outside
	// world (default: from this process's network namespace, through the
	// host's resolvers; a test gives a stand-in, mechanism/egress/egresstest).
	Egress egress.Config
}

// Jail is the native Linux jail mechanism. Safe for concurrent use, and
// across processes sharing a StateDir.
type Jail struct {
	cfg        Config
	tmpl       treeTemplate // the shared part of every root (template.go)
	bornStarts atomic.Int64 // starts of inits born restricted
	rootless   bool
	hash       string

	mu    sync.Mutex
	reaps map[string]chan struct{} // inits started by this process, closed once reaped
	nets  egress.Served            // egress proxies and published ports this process serves (network.go)
}

var (
	_ mechanism.Mechanism             = (*Jail)(nil)
	_ mechanism.CapabilityRequirer    = (*Jail)(nil)
	_ mechanism.CapabilityConstructor = (*Jail)(nil)
	_ mechanism.CapabilityGuarantor   = (*Jail)(nil)
	_ mechanism.EgressUpdater         = (*Jail)(nil)
	_ mechanism.OrphanSweeper         = (*Jail)(nil)
)

// New returns a Jail keeping its state under cfg.StateDir.
func New(cfg Config) (*Jail, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, mechanism.Invalid("StateDir", "must be an absolute path")
	}
	if cfg.UID == 0 && cfg.GID == 0 {
		cfg.UID, cfg.GID = 1000, 1000
	}
	if cfg.UID <= 0 || cfg.GID < 0 {
		// Root in the sandbox keeps the init's SETUID, SETGID and KILL.
		return nil, mechanism.Invalid("UID", fmt.Sprintf("workloads must run as a non-root uid (got %d:%d)", cfg.UID, cfg.GID))
	}
	if cfg.Prober == nil {
		cfg.Prober = mechanism.HostProber()
	}
	if cfg.RunDir == "" {
		cfg.RunDir, _ = mechanism.DefaultRunDir()
	}
	if cfg.IDMapDir == "" {
		cfg.IDMapDir = DefaultIDMapDir
	}
	if os.Getenv("MANAGOAT_JAIL_UNMAPPED_MOUNTS") == "1" {
		cfg.UnmappedMounts = true
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, err
	}
	if err := privateRunDir(cfg.RunDir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(cfg.StateDir, ".root"), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	// The sandbox's / is mounted here: whatever the caller's umask (077
	// made it 0700, and no workload could start), its user must traverse it.
	if err := os.Chmod(filepath.Join(cfg.StateDir, ".root"), 0o755); err != nil {
		return nil, err
	}
	// The cgroups' names carry the state directory's identity, path and
	// inode: the same path in another mount namespace (a container's
	// /var/lib/managoat) is another jail, whose sandboxes SweepOrphans
	// must not take for its own.
	var sd unix.Stat_t
	if err := unix.Stat(cfg.StateDir, &sd); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d:%d", cfg.StateDir, sd.Dev, sd.Ino))
	j := &Jail{cfg: cfg, rootless: os.Geteuid() != 0, hash: hex.EncodeToString(sum[:6]), reaps: map[string]chan struct{}{}}
	if !j.rootless {
		j.tmpl.dir = cfg.TemplateDir
	}
	return j, nil
}

// rootMount is where a starting sandbox's root is mounted, in the
// sandbox's own mount namespace: one directory serves every sandbox.
func (j *Jail) rootMount() string { return filepath.Join(j.cfg.StateDir, ".root") }

// Name implements mechanism.Mechanism.
func (j *Jail) Name() string { return "jail" }

// RequiredCapabilities: the host must provide every namespace, pivot_root,
// the privilege drop, seccomp and Landlock. Resource caps are required only
// when a Spec asks for them (the gate adds them).
func (j *Jail) RequiredCapabilities() []mechanism.Capability {
	return []mechanism.Capability{
		mechanism.ProcessSeparation, mechanism.FilesystemConfinement, mechanism.PrivilegeSeparation,
		mechanism.NetworkRestriction, mechanism.SyscallFilter, mechanism.Landlock,
	}
}

// ConstructedCapabilities: the wall-clock budget is enforced by the jail,
// and the egress allow list by its proxy (network.go; without root where
// mechanism/egress can enter the sandbox's user namespace).
func (j *Jail) ConstructedCapabilities() []mechanism.Capability {
	q := j.quotaCaps() // disk_quota is made by the jail (quota.go)
	if !j.rootless || rootlessEgress() {
		return append([]mechanism.Capability{mechanism.TimeBudget, mechanism.EgressAllowlist, mechanism.HostMounts}, q...)
	}
	return append([]mechanism.Capability{mechanism.TimeBudget, mechanism.HostMounts}, q...)
}

// GuaranteedCapabilities: everything, but disk quotas only where the host
// allows them (quota.go), and egress allow lists only as root.
func (j *Jail) GuaranteedCapabilities() []mechanism.Capability {
	cs := []mechanism.Capability{
		mechanism.ProcessSeparation, mechanism.FilesystemConfinement, mechanism.PrivilegeSeparation,
		mechanism.NetworkRestriction, mechanism.SyscallFilter, mechanism.Landlock,
		mechanism.ResourceLimits, mechanism.MemoryCap, mechanism.PidsCap, mechanism.CPUCap, mechanism.TimeBudget,
		mechanism.HostMounts, // mounts.go
	}
	if !j.rootless || rootlessEgress() {
		cs = append(cs, mechanism.EgressAllowlist)
	}
	return append(cs, j.quotaCaps()...) // disk_quota where the host allows it (quota.go)
}

// Owner returns the host uid and gid the workload's files are owned by;
// a caller writing into the home directory through HostPath should chown
// to them so the sandbox can modify the files.
func (j *Jail) Owner() (uid, gid int) {
	if j.rootless {
		return os.Getuid(), os.Getgid()
	}
	return j.cfg.UID, j.cfg.GID
}

type state struct {
	Mechanism string           `json:"mechanism"`
	ID        string           `json:"id"`
	Spec      mechanism.Spec   `json:"spec"`
	HomeDir   string           `json:"homeDir"`
	OwnHome   bool             `json:"ownHome"`
	Status    mechanism.Status `json:"status"`
	InitPid   int              `json:"initPid,omitempty"`
	InitStart uint64           `json:"initStart,omitempty"`
	Cgroup    string           `json:"cgroup,omitempty"`
	Socket    string           `json:"socket,omitempty"`
	Frozen    bool             `json:"frozen,omitempty"` // by Freeze, until Thaw or the init's end
	Note      string           `json:"note,omitempty"`
	Quota     *homeQuota       `json:"quota,omitempty"` // Spec.DiskBytes in force (quota.go)
	// Layer: Spec.DiskBytes in force on an image sandbox's writable
	// layer, whose upper/ and work/ are then in layer/ (quota.go). A
	// sandbox provisioned before layers were bounded has none.
	Layer *homeQuota `json:"layer,omitempty"`
	// IDBase is the first host id of the sandbox's uid/gid range (its
	// user namespace maps 0..65535 there; userns.go), 0 for none: a
	// sandbox provisioned without one runs as before.
	IDBase int `json:"idBase,omitempty"`
	// ImageRoot: the image's workload may be root of the user namespace
	// (an idmapped image layer; userns_image.go).
	ImageRoot bool `json:"imageRoot,omitempty"`
}

func (j *Jail) dir(id string) string { return filepath.Join(j.cfg.StateDir, id) }

func readState(dir string) (*state, error) {
	var err error
	for try := range 5 {
		var b []byte
		if b, err = os.ReadFile(filepath.Join(dir, "state.json")); err != nil {
			return nil, err
		}
		var st *state
		if st, err = decodeState(b); err == nil {
			if st.Mechanism != "jail" {
				return nil, fmt.Errorf("%s is not a jail sandbox", dir)
			}
			return st, nil
		}
		err = fmt.Errorf("corrupt state %s: %w", dir, err)
		if try > 0 {
			time.Sleep(200 * time.Microsecond) // a rewrite in progress
		}
	}
	return nil, err
}

// The state file is one JSON object whose last member is "sum", the CRC-32
// of the bytes before it, padded with spaces to whole pages. It is
// rewritten in place (one pwrite), so no inode is allocated or freed (on
// ext4 each costs a journal transaction, and a discard where mounted with
// it; a create+rename was ~465 µs here, this ~1 µs); a reader that sees a
// rewrite half done finds the sum wrong and reads again.
const (
	statePage = 4096
	sumKey    = `,"sum":"`
)

func decodeState(b []byte) (*state, error) {
	i := bytes.LastIndex(b, []byte(sumKey))
	if i < 0 {
		// Written by an earlier version (create + rename, no sum): whole
		// or absent, never half written.
		var st state
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, err
		}
		return &st, nil
	}
	if len(b) < i+len(sumKey)+8 {
		return nil, errors.New("truncated checksum")
	}
	if fmt.Sprintf("%08x", crc32.ChecksumIEEE(b[:i])) != string(b[i+len(sumKey):i+len(sumKey)+8]) {
		return nil, errors.New("checksum mismatch")
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func writeState(dir string, st *state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	b = b[:len(b)-1] // drop the closing brace
	b = fmt.Appendf(b, "%s%08x\"}\n", sumKey, crc32.ChecksumIEEE(b))
	n := (len(b) + statePage - 1) / statePage * statePage
	for len(b) < n {
		b = append(b, ' ')
	}
	f, err := os.OpenFile(filepath.Join(dir, "state.json"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	if err == nil && n > statePage {
		// Larger than one page: a shorter state later leaves no tail.
		err = f.Truncate(int64(n))
	} else if err == nil {
		if fi, serr := f.Stat(); serr == nil && fi.Size() > int64(n) {
			err = f.Truncate(int64(n))
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Provision implements mechanism.Mechanism. It creates the sandbox's
// directory and home; nothing runs until Start.
func (j *Jail) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := validateNetwork(spec); err != nil {
		return err
	}
	// Sources resolved once, here (mounts.go); the state keeps the result.
	mounts, err := mechanism.ResolveMounts(spec.Mounts)
	if err != nil {
		return err
	}
	spec.Mounts = mounts
	if err := mechanism.Gate(ctx, j, spec, j.cfg.Prober); err != nil {
		return err
	}
	unlock, err := flock.Lock(ctx, j.cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	dir := j.dir(id)
	if st, err := readState(dir); err == nil {
		if reflect.DeepEqual(normSpec(st.Spec), normSpec(spec)) {
			return nil
		}
		return fmt.Errorf("%w: %s", mechanism.ErrExists, id)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// A directory without state.json reads as absent (Status, List), so
	// the state is written last and no temporary directory is needed.
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	st := &state{Mechanism: "jail", ID: id, Spec: spec, Status: mechanism.StatusProvisioned}
	if err := j.provisionRange(ctx, dir, st); err != nil { // userns.go
		os.Remove(dir) // empty: nothing was written in it yet
		return err
	}
	provisioned := false
	defer func() {
		if !provisioned {
			j.abandonLayer(dir, st)                                    // quota.go
			j.releaseRange(context.WithoutCancel(ctx), dir, st.IDBase) // userns.go
		}
	}()
	uid, gid := j.Owner()
	if !j.rootless {
		uid, gid = j.imageUser(spec, st.ImageRoot)
		uid, gid = st.IDBase+uid, st.IDBase+gid
	}
	if err := j.applyLayerQuota(ctx, dir, st); err != nil { // quota.go
		return err
	}
	if err := provisionImage(dir, spec.Image, st.IDBase, st.ImageRoot, st.Layer != nil); err != nil {
		return err
	}
	if spec.HomeDir != "" {
		if err := os.MkdirAll(spec.HomeDir, 0o755); err != nil {
			return err
		}
		st.HomeDir = spec.HomeDir
	} else {
		if err := os.Mkdir(filepath.Join(dir, "home"), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		st.HomeDir, st.OwnHome = filepath.Join(dir, "home"), true
	}
	if err := j.applyQuota(ctx, dir, st, uid, gid); err != nil { // quota.go
		return err
	}
	if st.IDBase != 0 && !st.OwnHome {
		if err := shiftHome(ctx, st.HomeDir, st.IDBase); err != nil { // userns.go
			return err
		}
	}
	if err := os.Chown(st.HomeDir, uid, gid); err != nil {
		return err
	}
	if err := writeState(dir, st); err != nil {
		return err
	}
	provisioned = true
	return nil
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

// procStart returns the start time (clock ticks since boot) of pid, or 0,
// and its state letter.
func procStart(pid int) (uint64, byte) {
	start, state, _, _ := procStat(pid)
	return start, state
}

// pfExiting is the kernel's PF_EXITING: the process has begun to exit.
const pfExiting = 0x4

// procStat returns pid's start time (clock ticks since boot; 0 when it is
// gone), state letter, flags and pending signals (the thread's own set,
// where a SIGKILL sent to the process is put at once), from
// /proc/<pid>/stat.
func procStat(pid int) (start uint64, state byte, flags, pending uint64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 29 {
		return 0, 0, 0, 0
	}
	start, _ = strconv.ParseUint(f[19], 10, 64)
	flags, _ = strconv.ParseUint(f[6], 10, 64)
	pending, _ = strconv.ParseUint(f[28], 10, 64)
	return start, f[0][0], flags, pending
}

// dying reports whether st's init is gone or on its way out: not there
// (or another process under its number), a zombie, exiting (PF_EXITING:
// an init closes its descriptors, then, as pid 1, waits for the rest of
// its namespace to die before it is a zombie), or killed (SIGKILL
// pending, not yet acted on). A dying init serves no more requests.
func dying(st *state) bool {
	start, state, flags, pending := procStat(st.InitPid)
	return start == 0 || start != st.InitStart || state == 'Z' || state == 'X' ||
		flags&pfExiting != 0 || pending&(1<<(unix.SIGKILL-1)) != 0
}

// alive reports whether the recorded init still runs (same pid, same start).
func alive(st *state) bool {
	if st.InitPid <= 0 {
		return false
	}
	start, s := procStart(st.InitPid)
	return start != 0 && start == st.InitStart && s != 'Z' && s != 'X'
}

func (j *Jail) group(st *state) *cgroups.Group {
	if st.Cgroup == "" {
		return nil
	}
	l, err := mechanism.CgroupLayout()
	if err != nil {
		return nil
	}
	return l.OpenFor(st.Cgroup, limitsOf(st.Spec))
}

// launched is what launch makes for st whether or not st records it yet:
// its cgroups (nil without a cgroup layout) and its control socket. Both
// are named after the sandbox, so cleanup finds those of a start cut short
// (its process killed) before it wrote them down, and with them the init
// it left running.
func (j *Jail) launched(st *state) (*cgroups.Group, string) {
	sum := sha256.Sum256([]byte(j.dir(st.ID)))
	sock := filepath.Join(j.cfg.RunDir, hex.EncodeToString(sum[:8])+".sock")
	l, err := mechanism.CgroupLayout()
	if err != nil || l.Mode == cgroups.ModeNone {
		return nil, sock
	}
	return l.OpenFor(cgroupPrefix+j.hash+"-"+st.ID, limitsOf(st.Spec)), sock
}

func limitsOf(s mechanism.Spec) cgroups.Limits {
	return cgroups.Limits{MemoryBytes: s.MemoryBytes, Pids: s.Pids, CPUMillis: s.CPUMillis}
}

// Start implements mechanism.Mechanism: it launches the sandbox's init in
// new namespaces, inside its cgroups, and waits until it serves.
func (j *Jail) Start(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	dir := j.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
	}
	// The network namespace takes longest to make: begin it now, while
	// the state is read and the cgroups made (released unused if the
	// sandbox turns out to be running or cannot start).
	born := !j.rootless && mechanism.ProcPidnsOption() == nil
	var netns *netPrep
	if born {
		netns = newNetPrep()
		defer netns.release()
	}
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return err
	}
	if alive(st) {
		return j.adoptNetwork(st) // a new manager takes over a running sandbox
	}
	// A home unmounted by a reboot is mounted again before the sandbox's
	// namespaces are made from the host's (quota.go).
	if err := j.ensureQuota(st); err != nil {
		return err
	}
	var rs *restrictedStart
	if born {
		// The threads that make the namespaces and the tree begin now;
		// launch hands them the init to clone (or they are abandoned).
		lc := j.launchConfig(st)
		if st.IDBase != 0 && len(lc.Mounts) > 0 {
			// Its host mounts are idmapped to its workload (mounts.go);
			// closed after the tree's thread is done (abortUnused, or
			// launch waiting for the tree: deferred calls run last first).
			im := newMountIdmaps(lc.Mounts, st.IDBase, lc.UID, lc.GID)
			defer im.close()
			lc.idmaps = im
		}
		rs = beginRestricted(lc, netns, &j.tmpl)
		defer rs.abortUnused()
	}
	phase("begun")
	if err := mechanism.Gate(ctx, j, st.Spec, j.cfg.Prober); err != nil {
		return err
	}
	phase("gate")
	j.cleanup(ctx, st) // leftovers of an init that died by itself
	phase("cleanup")
	prev := st.Status
	st.Status = mechanism.StatusStarting
	if err := writeState(dir, st); err != nil {
		return err
	}
	if err := j.launch(ctx, dir, st, rs); err != nil {
		// The host may have lost a capability the gate remembered.
		mechanism.ForgetProbes(j.cfg.Prober)
		st.Status = prev
		if prev != mechanism.StatusProvisioned {
			st.Status = mechanism.StatusStopped
		}
		st.InitPid, st.InitStart = 0, 0
		st.Note = "start failed: " + err.Error()
		_ = writeState(dir, st)
		return err
	}
	st.Status = mechanism.StatusRunning
	st.Note = ""
	err = writeState(dir, st)
	phase("state")
	return err
}

// launchConfig is what the init of st is started with.
func (j *Jail) launchConfig(st *state) launchConfig {
	lc := launchConfig{
		Root: j.rootMount(), HomeDir: st.HomeDir, Hostname: hostname(st.ID),
		Rootless: j.rootless, UID: j.cfg.UID, GID: j.cfg.GID, Pids: st.Spec.Pids,
		Image: imageDirs(j.dir(st.ID), st.Spec.Image, st.Layer != nil), Mounts: st.Spec.Mounts,
	}
	if st.Spec.Image != nil {
		lc.UID, lc.GID = j.imageUser(st.Spec, st.ImageRoot)
		if lc.Image != nil {
			lc.Image.Mapped = st.ImageRoot
		}
	}
	lc.IDBase = st.IDBase
	return lc
}

// listenControl makes the listening socket the init serves on. Made with
// the system calls rather than net.ListenUnix: this process never accepts
// on it, so it needs no poller registration, and net would read
// /proc/sys/net/core/somaxconn for the backlog (the kernel caps it there).
func listenControl(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		os.Remove(path)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// launch starts st's init: through rs, begun by Start, when the init is
// born restricted, else with startInit.
func (j *Jail) launch(ctx context.Context, dir string, st *state, rs *restrictedStart) (err error) {
	lim := limitsOf(st.Spec)
	limited := lim != cgroups.Limits{}
	var g *cgroups.Group
	if l, lerr := mechanism.CgroupLayout(); lerr == nil && l.Mode != cgroups.ModeNone {
		name := cgroupPrefix + j.hash + "-" + st.ID
		stale := l.OpenFor(name, lim)
		if stale.Exists() {
			stale.Kill()
			_ = stale.Remove(ctx)
		}
		g, err = l.Create(name, lim)
		if err != nil {
			if limited {
				return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{Name: mechanism.ResourceLimits, Detail: err.Error()}}}
			}
			g = nil // accounting only; without limits a rootless jail runs without cgroups
		}
	} else if limited {
		return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{Name: mechanism.ResourceLimits, Detail: fmt.Sprintf("no cgroup hierarchy: %v", lerr)}}}
	}
	phase("cgroup")
	if g != nil {
		st.Cgroup = g.Name
		defer func() {
			if err != nil {
				g.Kill()
				_ = g.Remove(context.Background())
				st.Cgroup = ""
			}
		}()
	}
	_, sock := j.launched(st)
	_ = os.Remove(sock)
	lf, err := listenControl(sock)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer lf.Close()
	defer func() {
		if err != nil {
			os.Remove(sock)
		}
	}()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	defer readyW.Close()
	born := rs != nil
	mode := initGo
	if born {
		mode = initMode()
	}
	cInit := mode != initGo
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"managoat-jail-init"}
	if cInit {
		// A C init reports on the ready pipe, and so does whatever kills
		// it before it runs (the dynamic loader, for the linked one): it
		// needs no log file (one inode less per start).
		cmd.Env = []string{helperEnv + "=cinit"}
		cmd.Stderr = readyW
	} else {
		logf, err := os.OpenFile(filepath.Join(dir, "init.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd.Env = []string{helperEnv + "=init", "GOMAXPROCS=1"}
		cmd.Stdout, cmd.Stderr = logf, logf
	}
	cmd.ExtraFiles = []*os.File{lf, cfgR, readyW}
	joinUserns, err := userNSFile(cmd, rs, cInit) // userns_prep.go
	if err != nil {
		return err
	}
	if mode == initStandalone {
		// Executed as the child's descriptor (standaloneInit), which
		// the init closes first thing like any other past its three.
		f, _ := standaloneInit() // initMode made sure it is there
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		cmd.Path = "/proc/self/fd/" + strconv.Itoa(2+len(cmd.ExtraFiles))
		cmd.Env = []string{}
	}
	sys := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP,
		Setsid:     true,
	}
	if j.rootless {
		sys.Cloneflags |= unix.CLONE_NEWUSER
		sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	if st.IDBase != 0 && !born {
		return fmt.Errorf("sandbox %s has a uid range of its own, which needs its init born restricted: %v", st.ID, j.usernsSupport())
	}
	if g != nil && g.V2 != "" {
		fd, err := g.V2FD()
		if err != nil {
			return fmt.Errorf("open v2 cgroup: %w", err)
		}
		defer unix.Close(fd)
		sys.UseCgroupFD, sys.CgroupFD = true, fd
	}
	lc := j.launchConfig(st)
	var tree *launchConfig
	if !j.rootless {
		// The starting thread enters the other namespaces and builds them.
		sys.Cloneflags = unix.CLONE_NEWPID | unix.CLONE_NEWCGROUP
		lc.TreeBuilt = true
		tree = &lc
		lc.unshareUserns = st.IDBase != 0 && cInit && !joinUserns && rs != nil && rs.userns == nil
		if !joinUserns && !lc.unshareUserns {
			mapRange(sys, st.IDBase) // userns.go
		}
	}
	cmd.SysProcAttr = sys
	var cConfig []byte
	if cInit {
		get := managerSeccomp
		if hasWritableMount(lc.Mounts) {
			get = managerSeccompMounts // seccomp.go
		}
		prog, err := get()
		if err != nil {
			return err
		}
		lc.joinUserns = joinUserns
		cConfig = cInitConfig(lc, prog)
	}
	// Place the init in its v1 cgroups before it does anything: every
	// workload is its descendant, so every workload is born inside. Then
	// read back what is in force.
	place := func(pid int) error {
		if g == nil {
			return nil
		}
		if err := g.AddProc(pid); err != nil {
			return err
		}
		if err := g.Verify(lim, pid); err != nil {
			return fmt.Errorf("limits not in force, sandbox killed: %w", err)
		}
		return nil
	}
	send := func() error {
		var err error
		if cInit {
			_, err = cfgW.Write(cConfig)
		} else {
			err = json.NewEncoder(cfgW).Encode(lc)
		}
		if lc.unshareUserns {
			// Kept open: the init waits on it for its maps (userns_prep.go).
		} else if cerr := cfgW.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("send launch config: %w", err)
		}
		return nil
	}
	var built <-chan error
	phase("command")
	if born {
		lc.Entered = true
		built, err = rs.start(cmd, initHooks{place: place, send: send})
	} else {
		built, err = startInit(cmd, j.rootless, tree)
	}
	if err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	phase("cloned")
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		if err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			<-done
		} else {
			j.mu.Lock()
			j.reaps[dir] = done
			j.mu.Unlock()
		}
	}()
	// The sandbox's network is set up while the init gets ready.
	netw := j.beginNetwork(st, pid, done)
	defer func() {
		if err != nil {
			netw.abort()
		}
	}()
	cfgR.Close()
	readyW.Close()
	if born {
		// Placed, built and sent on the tree's thread (initHooks).
		if err := <-built; err != nil {
			return fmt.Errorf("start the sandbox: %w", err)
		}
		phase("built")
	} else {
		if err := place(pid); err != nil {
			return err
		}
		if built != nil {
			if err := <-built; err != nil {
				return fmt.Errorf("build the sandbox's root: %w", err)
			}
		}
		if err := send(); err != nil {
			return err
		}
	}
	line := make(chan string, 1)
	go func() {
		br := bufio.NewReader(readyR)
		s, _ := br.ReadString('\n')
		if lc.unshareUserns && strings.TrimSpace(s) == "userns" {
			s = mapUnshared(pid, st.IDBase, cfgW, br) // userns_prep.go
		}
		line <- strings.TrimSpace(s)
	}()
	var msg string
	select {
	case msg = <-line:
	case <-ctx.Done():
		_ = unix.Kill(pid, unix.SIGKILL)
		<-line
		return ctx.Err()
	}
	phase("ready")
	if msg != "ready" {
		if msg == "" && cInit {
			msg = "init exited without a word"
		} else if msg == "" {
			// The log's first line says why; a Go init's crash dump
			// follows it, which is no error message.
			b, _ := os.ReadFile(filepath.Join(dir, "init.log"))
			first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
			msg = "init exited: " + first
		}
		return fmt.Errorf("jail init: %s", msg)
	}
	// A process that starts sandboxes again and again gets a template
	// for the next ones (template.go); one that starts one (managoat
	// run, a sandbox's supervisor) does not pay for building it.
	if born && lc.Image == nil && j.bornStarts.Add(1) >= 2 {
		j.tmpl.ensure(lc)
	}
	if err = netw.wait(); err != nil {
		return err
	}
	phase("network")
	start, _ := procStart(pid)
	st.InitPid, st.InitStart, st.Socket = pid, start, sock
	return nil
}

func hostname(id string) string {
	if len(id) > 63 {
		id = id[:63]
	}
	return strings.Trim(strings.ReplaceAll(strings.ReplaceAll(id, "_", "-"), ".", "-"), "-")
}

// cleanup kills whatever is left of st's init and removes its cgroups and
// socket. The caller holds the sandbox lock.
func (j *Jail) cleanup(ctx context.Context, st *state) {
	g, sock := j.group(st), st.Socket
	if g == nil || sock == "" {
		lg, ls := j.launched(st) // a start cut short before it recorded them
		if g == nil {
			g = lg
		}
		if sock == "" {
			sock = ls
		}
	}
	if alive(st) {
		_ = unix.Kill(st.InitPid, unix.SIGKILL)
	}
	j.stopNetwork(st.ID)
	if g != nil {
		g.Kill()
	}
	j.mu.Lock()
	done := j.reaps[j.dir(st.ID)]
	delete(j.reaps, j.dir(st.ID))
	j.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	} else {
		for i := 0; i < 2000 && alive(st); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if g != nil {
		_ = g.Remove(ctx)
	}
	_ = os.Remove(sock)
	st.InitPid, st.InitStart, st.Cgroup, st.Socket, st.Frozen = 0, 0, "", "", false
}

// Stop implements mechanism.Mechanism: it kills the init (and with it the
// whole pid namespace), removes the cgroups and keeps the files.
func (j *Jail) Stop(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	return j.stop(ctx, id, true)
}

// stop is Stop; record is false for a Destroy, which removes the state
// next (the Stopping state is written all the same: a Destroy cut short
// leaves a sandbox that the next Stop or Destroy cleans up).
func (j *Jail) stop(ctx context.Context, id string, record bool) error {
	dir := j.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if st.Status == mechanism.StatusProvisioned && st.InitPid == 0 {
		return nil
	}
	st.Status = mechanism.StatusStopping
	if err := writeState(dir, st); err != nil {
		return err
	}
	j.cleanup(ctx, st)
	if !record {
		return nil
	}
	st.Status = mechanism.StatusStopped
	return writeState(dir, st)
}

// Destroy implements mechanism.Mechanism. A home directory given in
// Spec.HomeDir is left in place; one the jail created is removed.
func (j *Jail) Destroy(ctx context.Context, id string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	dir := j.dir(id)
	var base int
	if st, err := readState(dir); err == nil {
		base = st.IDBase
	}
	if err := j.stop(ctx, id, false); err != nil {
		return err
	}
	if err := j.releaseQuota(id); err != nil { // quota.go
		return err
	}
	defer j.releaseRange(ctx, dir, base) // userns.go
	gone := filepath.Join(j.cfg.StateDir, ".destroy-"+randHex())
	if err := os.Rename(dir, gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(gone)
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Status implements mechanism.Mechanism from what it observes: the state
// directory, whether the recorded init still runs, and whether it answers.
func (j *Jail) Status(ctx context.Context, id string) (mechanism.Status, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return mechanism.StatusUnknown, err
	}
	dir := j.dir(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return mechanism.StatusAbsent, nil
	} else if err != nil {
		return mechanism.StatusUnknown, err
	}
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return mechanism.StatusAbsent, nil // destroyed between the two reads
		}
		return mechanism.StatusUnknown, err
	}
	switch st.Status {
	case mechanism.StatusProvisioned, mechanism.StatusStopped:
		return st.Status, nil
	case mechanism.StatusStarting, mechanism.StatusStopping:
		if flock.Held(dir) {
			return st.Status, nil
		}
	}
	// Recorded running (or a transition whose owner died): look.
	if !alive(st) {
		return mechanism.StatusStopped, nil
	}
	if st.Frozen {
		return mechanism.StatusRunning, nil // a frozen init answers nothing
	}
	if err := ping(ctx, st.Socket); err != nil {
		return mechanism.StatusUnknown, nil
	}
	return mechanism.StatusRunning, nil
}

// ListRunning implements mechanism.Mechanism.
func (j *Jail) ListRunning(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(j.cfg.StateDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return []string{}, nil
		}
		return nil, err
	}
	out := []string{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if mechanism.ValidateID(e.Name()) != nil {
			continue
		}
		if _, err := readState(filepath.Join(j.cfg.StateDir, e.Name())); err != nil {
			continue
		}
		if s, _ := j.Status(ctx, e.Name()); s == mechanism.StatusRunning {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Usage implements mechanism.Mechanism: CPU time, the CPU rate over
// mechanism.UsageWindow and memory from the sandbox's cgroups, disk from
// the allocated blocks under its home and, for an image sandbox, its
// writable layer (or its copy of the image).
func (j *Jail) Usage(ctx context.Context, id string) (mechanism.Usage, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return mechanism.Usage{}, err
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return mechanism.Usage{}, fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return mechanism.Usage{}, err
	}
	var u mechanism.Usage
	if g := j.group(st); g != nil && alive(st) {
		rate, cpu, err := mechanism.CPURate(ctx, func() (time.Duration, bool) { return g.Stats().CPUTime, true })
		if err != nil {
			return u, err
		}
		u.CPUTime, u.CPUMillicores, u.MemoryBytes = cpu, rate, g.Stats().MemoryBytes
	}
	_ = filepath.WalkDir(st.HomeDir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || ctx.Err() != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if s, ok := info.Sys().(*syscall.Stat_t); ok {
				u.DiskBytes += s.Blocks * 512
			}
		}
		return nil
	})
	u.DiskBytes += layerBytes(ctx, j.dir(id), st) // image.go
	return u, nil
}

// HostPath implements mechanism.Mechanism.
func (j *Jail) HostPath(id, sandboxPath string) (string, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return "", err
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return "", err
	}
	// A file written before the first Start after a reboot goes into the
	// home's quota, not under its mount point (quota.go).
	if err := j.ensureQuota(st); err != nil {
		return "", err
	}
	return mechanism.ResolveHome(st.HomeDir, sandboxPath)
}
