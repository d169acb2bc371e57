package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
	"github.com/managoat/managoat/mechanism/internal/denylist"
	"github.com/managoat/managoat/mechanism/internal/etcfiles"
)

// The subset of the OCI runtime spec (1.0) this mechanism writes. It is
// hand-written rather than imported from opencontainers/runtime-spec: a
// few stable JSON fields do not justify a dependency.
type ociSpec struct {
	OCIVersion  string            `json:"ociVersion"`
	Process     ociProcess        `json:"process"`
	Root        ociRoot           `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []ociMount        `json:"mounts"`
	Linux       ociLinux          `json:"linux"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	Terminal        bool            `json:"terminal"`
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	Rlimits         []ociRlimit     `json:"rlimits,omitempty"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Resources     *ociResources    `json:"resources,omitempty"`
	CgroupsPath   string           `json:"cgroupsPath,omitempty"`
	Namespaces    []ociNamespace   `json:"namespaces"`
	Seccomp       *ociSeccomp      `json:"seccomp,omitempty"`
	MaskedPaths   []string         `json:"maskedPaths,omitempty"`
	ReadonlyPaths []string         `json:"readonlyPaths,omitempty"`
	Devices       []map[string]any `json:"devices,omitempty"`
}

type ociResources struct {
	Devices []ociDeviceRule `json:"devices,omitempty"`
	Memory  *ociMemory      `json:"memory,omitempty"`
	CPU     *ociCPU         `json:"cpu,omitempty"`
	Pids    *ociPids        `json:"pids,omitempty"`
}

type ociDeviceRule struct {
	Allow  bool   `json:"allow"`
	Access string `json:"access,omitempty"`
}

type ociMemory struct {
	Limit *int64 `json:"limit,omitempty"`
	Swap  *int64 `json:"swap,omitempty"`
}

type ociCPU struct {
	Quota  *int64  `json:"quota,omitempty"`
	Period *uint64 `json:"period,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociSeccomp struct {
	DefaultAction string           `json:"defaultAction"`
	Architectures []string         `json:"architectures,omitempty"`
	Syscalls      []ociSyscallRule `json:"syscalls"`
}

type ociSyscallRule struct {
	Names    []string     `json:"names"`
	Action   string       `json:"action"`
	ErrnoRet *uint        `json:"errnoRet,omitempty"`
	Args     []ociSyscArg `json:"args,omitempty"`
}

type ociSyscArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// initScript is the container's init: it idles and reaps (dash's wait
// reaps every child, including processes reparented to pid 1).
const initScript = `trap 'exit 0' TERM; while :; do sleep 2147483647 & wait $!; done`

// hostname is every container's uts hostname.
const hostname = "sprite"

// baseEnv is every process's environment before Spec.Env and per-call
// pairs; the managing process's environment is never inherited.
func baseEnv() []string {
	return []string{"PATH=" + mechanism.DefaultPath, "HOME=" + mechanism.Home, "USER=sprite", "LOGNAME=sprite",
		"SHELL=/bin/bash", "LANG=C.UTF-8", "TMPDIR=/tmp"}
}

// mergeEnv joins environments; later entries win, one per key.
func mergeEnv(parts ...[]string) []string {
	idx := map[string]int{}
	var out []string
	for _, p := range parts {
		for _, e := range p {
			k, _, _ := strings.Cut(e, "=")
			if i, ok := idx[k]; ok {
				out[i] = e
				continue
			}
			idx[k] = len(out)
			out = append(out, e)
		}
	}
	return out
}

func noCaps() ociCapabilities {
	e := []string{}
	return ociCapabilities{Bounding: e, Effective: e, Inheritable: e, Permitted: e, Ambient: e}
}

func rlimits() []ociRlimit {
	return []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 4096, Soft: 4096}}
}

// etcBinds are the host /etc entries a workload may need, bound read-only;
// nothing secret (no shadow, no ssh keys, no machine credentials). The
// same list as the jail's.
var etcBinds = []string{
	"alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
	"ssl", "ca-certificates", "ca-certificates.conf", "mime.types", "protocols",
	"services", "bash.bashrc", "profile", "profile.d", "inputrc", "terminfo",
	"debian_version", "os-release", "gai.conf", "host.conf", "magic", "timezone",
	"python3", "python3.11", "perl", "vim", "skel", "environment", "login.defs",
}

// runtimeDirs are the host's runtime trees: bound read-only when a
// directory, recreated as the same symlink when a link (merged /usr).
var runtimeDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// hostLayout is what the host offers the root: which runtime trees and
// /etc entries exist, and as what. It decides the rootfs skeleton (shared
// by every sandbox of a mechanism, keyed by the layout) and the mounts.
type hostLayout struct {
	Links    map[string]string `json:"links"`    // top-level path -> symlink target
	Dirs     []string          `json:"dirs"`     // top-level dirs bound read-only
	EtcLinks map[string]string `json:"etcLinks"` // /etc entry -> symlink target
	EtcDirs  []string          `json:"etcDirs"`
	EtcFiles []string          `json:"etcFiles"`
}

func scanHost() hostLayout {
	h := hostLayout{Links: map[string]string{}, EtcLinks: map[string]string{}}
	for _, p := range runtimeDirs {
		st, err := os.Lstat(p)
		switch {
		case err != nil:
		case st.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(p); err == nil {
				h.Links[p] = t
			}
		case st.IsDir():
			h.Dirs = append(h.Dirs, p)
		}
	}
	for _, name := range etcBinds {
		st, err := os.Lstat("/etc/" + name)
		switch {
		case err != nil:
		case st.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink("/etc/" + name); err == nil {
				h.EtcLinks[name] = t
			}
		case st.IsDir():
			h.EtcDirs = append(h.EtcDirs, name)
		case st.Mode().IsRegular():
			h.EtcFiles = append(h.EtcFiles, name)
		}
	}
	return h
}

// rootfsVersion changes when the skeleton's content does.
const rootfsVersion = "3"

func (h hostLayout) key() string {
	b, _ := json.Marshal(h)
	b = append(b, rootfsVersion...)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// buildRootfs writes the read-only skeleton at dir: the merged-/usr links,
// mount points, and the generated /etc. Nothing in it is per sandbox.
func buildRootfs(dir string, h hostLayout) error {
	for p, t := range h.Links {
		if err := os.Symlink(t, filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	for _, d := range append(h.Dirs, "/etc", mechanism.Home, "/tmp", "/proc", "/dev", "/sys", "/run", "/var", "/root") {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	etc := filepath.Join(dir, "etc")
	for name, content := range etcfiles.Files(hostname) {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for name, t := range h.EtcLinks {
		if err := os.Symlink(t, filepath.Join(etc, name)); err != nil {
			return err
		}
	}
	for _, name := range h.EtcDirs {
		if err := os.Mkdir(filepath.Join(etc, name), 0o755); err != nil {
			return err
		}
	}
	for _, name := range h.EtcFiles {
		if err := os.WriteFile(filepath.Join(etc, name), nil, 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "root"), 0o700); err != nil {
		return err
	}
	// runc gives a tmpfs the mode of the directory it is mounted on.
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return err
	}
	if err := os.Symlink("/tmp", filepath.Join(dir, "var", "tmp")); err != nil {
		return err
	}
	if runtime.GOARCH != "amd64" {
		return nil
	}
	elf, err := filterExecELF()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(filterExecPath)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, filterExecPath), elf, 0o755)
}

// rootfs returns the shared rootfs for the host's current layout, building
// it on first use (in a temporary directory renamed into place).
func (m *Mechanism) rootfs(h hostLayout) (string, error) {
	dir := filepath.Join(m.base, "rootfs-"+h.key())
	m.rootfsMu.Lock()
	defer m.rootfsMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(m.base, "tmp"), "rootfs-")
	if err != nil {
		return "", err
	}
	if err := buildRootfs(tmp, h); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("oci: build rootfs: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(dir); serr == nil {
			return dir, nil // another process built it
		}
		return "", err
	}
	return dir, nil
}

// writeBundle writes the bundle's config.json at dir, over the shared
// rootfs (absolute path) with the host layout h.
func writeBundle(dir, rootfs string, h hostLayout, sb *sandbox, rt runtimeInfo) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var mounts []ociMount
	for _, p := range h.Dirs {
		mounts = append(mounts, ociMount{Destination: p, Type: "bind", Source: p, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	for _, name := range append(slices.Clone(h.EtcDirs), h.EtcFiles...) {
		mounts = append(mounts, ociMount{Destination: "/etc/" + name, Type: "bind", Source: "/etc/" + name, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	mounts = append([]ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}, mounts...)
	mounts = append(mounts,
		ociMount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		ociMount{Destination: mechanism.Home, Type: "bind", Source: sb.HomeDir, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
	)
	mounts = append(mounts, hostMounts(sb.Spec, rt)...) // mounts.go
	spec := ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			User:            ociUser{UID: UID, GID: GID},
			Args:            []string{"/bin/sh", "-c", initScript},
			Env:             mergeEnv(baseEnv(), sb.Spec.Env),
			Cwd:             mechanism.Home,
			Capabilities:    noCaps(),
			Rlimits:         rlimits(),
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: rootfs, Readonly: true},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: ociLinux{
			CgroupsPath: sb.Cgroup,
			Resources:   resources(sb.Spec),
			Namespaces:  []ociNamespace{{"pid"}, {"network"}, {"ipc"}, {"uts"}, {"mount"}},
			Seccomp:     seccompProfile(),
			// As the jail: /proc/key-users counts every host user's keys,
			// /proc/config.gz is the host kernel's build, /proc/kallsyms
			// its symbols (zeroed addresses, still a list of what is in it).
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/key-users",
				"/proc/config.gz", "/proc/kallsyms", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		Annotations: map[string]string{"managoat.mechanism": "oci/" + rt.name, "managoat.sandbox": sb.ID},
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

func resources(s mechanism.Spec) *ociResources {
	r := &ociResources{Devices: []ociDeviceRule{{Allow: false, Access: "rwm"}}}
	if s.MemoryBytes > 0 {
		lim := s.MemoryBytes
		swap := s.MemoryBytes // memory+swap = memory: no swap
		r.Memory = &ociMemory{Limit: &lim, Swap: &swap}
	}
	if s.CPUMillis > 0 {
		quota := s.CPUMillis * cgroups.CPUPeriod / 1000
		if quota < 1000 {
			quota = 1000 // the kernel's minimum quota is 1 ms
		}
		period := uint64(cgroups.CPUPeriod)
		r.CPU = &ociCPU{Quota: &quota, Period: &period}
	}
	if s.Pids > 0 {
		r.Pids = &ociPids{Limit: s.Pids}
	}
	return r
}

// The namespace flags of clone a workload may not use.
var cloneNewFlags = denylist.CloneNewFlags

func seccompProfile() *ociSeccomp {
	eperm, enosys := uint(1), uint(38)
	names := denylist.Syscalls(runtime.GOARCH)
	var arches []string
	if runtime.GOARCH == "amd64" {
		arches = []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}
	}
	rules := []ociSyscallRule{{Names: names, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm}}
	for _, f := range cloneNewFlags {
		rules = append(rules, ociSyscallRule{Names: []string{"clone"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []ociSyscArg{{Index: 0, Value: f, ValueTwo: f, Op: "SCMP_CMP_MASKED_EQ"}}})
	}
	// clone3 passes its flags in memory, which a filter cannot read:
	// ENOSYS makes libc fall back to clone, which is filtered above.
	rules = append(rules, ociSyscallRule{Names: []string{"clone3"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys})
	// io_setup draws on the host-wide AIO limit (fs.aio-max-nr): one
	// sandbox's sixteen io_setup(4096) left the host none. ENOSYS, as on a
	// kernel without AIO (libaio users fall back), as the jail does.
	rules = append(rules, ociSyscallRule{Names: []string{"io_setup"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys})
	return &ociSeccomp{DefaultAction: "SCMP_ACT_ALLOW", Architectures: arches, Syscalls: rules}
}

// processSpec is the process.json of a runtime exec.
func processSpec(argv, env []string, cwd string) ([]byte, error) {
	p := ociProcess{
		User: ociUser{UID: UID, GID: GID}, Args: argv, Env: env, Cwd: cwd,
		Capabilities: noCaps(), Rlimits: rlimits(), NoNewPrivileges: true,
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("oci: process spec: %w", err)
	}
	return b, nil
}
