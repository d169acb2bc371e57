package oci

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// ccgroup is a container's cgroup as the kernel places its init: one
// directory per v1 controller, and the unified (v2) directory.
type ccgroup struct {
	v1 map[string]string // controller -> dir
	v2 string            // unified dir, "" if none
}

// containerCgroup finds the cgroup of pid (v1, v2 and hybrid layouts).
func containerCgroup(pid int) (*ccgroup, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("oci: no init pid")
	}
	l, err := cgroups.Of(pid, "memory", "pids", "cpu", "cpuacct", "freezer")
	if err != nil {
		return nil, fmt.Errorf("oci: cgroups of pid %d: %w", pid, err)
	}
	return &ccgroup{v1: l.V1, v2: l.V2}, nil
}

// file returns the path of a controller's file: v1 when the controller is
// mounted as v1, else the unified directory.
func (c *ccgroup) file(ctrl, v1name, v2name string) string {
	if d, ok := c.v1[ctrl]; ok {
		return filepath.Join(d, v1name)
	}
	if c.v2 != "" && v2name != "" {
		return filepath.Join(c.v2, v2name)
	}
	return ""
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func readKey(p, key string) int64 {
	f, err := os.Open(p)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// verify reads back what is in force for the container whose init is
// pid: every limit of spec in its cgroup, and namespaces other than ours.
func (m *Mechanism) verify(pid int, spec mechanism.Spec) error {
	refuse := func(c mechanism.Capability, format string, args ...any) error {
		return &mechanism.UnavailableError{Mechanism: m.Name(), Missing: []mechanism.Report{{Name: c,
			Detail: "not in force after start: " + fmt.Sprintf(format, args...)}}}
	}
	for _, ns := range []struct {
		name string
		c    mechanism.Capability
	}{{"net", mechanism.NetworkRestriction}, {"mnt", mechanism.FilesystemConfinement}, {"pid", mechanism.ProcessSeparation}} {
		if ns.name == "pid" && m.rt.gvisor {
			continue // the sentry is the container's kernel and keeps its pid namespace itself
		}
		ours, err1 := os.Readlink("/proc/self/ns/" + ns.name)
		theirs, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns.name))
		if err1 != nil || err2 != nil {
			return refuse(ns.c, "cannot read the %s namespace of pid %d: %v %v", ns.name, pid, err1, err2)
		}
		if ours == theirs {
			return refuse(ns.c, "the container shares the managing process's %s namespace", ns.name)
		}
	}
	if spec.MemoryBytes == 0 && spec.Pids == 0 && spec.CPUMillis == 0 {
		return nil
	}
	cg, err := containerCgroup(pid)
	if err != nil {
		return refuse(mechanism.ResourceLimits, "%v", err)
	}
	page := int64(os.Getpagesize())
	if spec.MemoryBytes > 0 {
		p := cg.file("memory", "memory.limit_in_bytes", "memory.max")
		got, err := readInt(p)
		if err != nil || got < 0 || got > spec.MemoryBytes || got < spec.MemoryBytes/page*page {
			return refuse(mechanism.MemoryCap, "%s is %d (%v), want %d", p, got, err, spec.MemoryBytes)
		}
	}
	if spec.Pids > 0 {
		p := cg.file("pids", "pids.max", "pids.max")
		got, err := readInt(p)
		if err != nil || got != spec.Pids {
			return refuse(mechanism.PidsCap, "%s is %d (%v), want %d", p, got, err, spec.Pids)
		}
	}
	if spec.CPUMillis > 0 {
		var quota int64
		if d, ok := cg.v1["cpu"]; ok {
			quota, err = readInt(filepath.Join(d, "cpu.cfs_quota_us"))
		} else if cg.v2 != "" {
			var b []byte
			b, err = os.ReadFile(filepath.Join(cg.v2, "cpu.max"))
			if f := strings.Fields(string(b)); err == nil && len(f) == 2 && f[0] != "max" {
				quota, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
		if quota <= 0 {
			return refuse(mechanism.CPUCap, "no CPU quota in the container's cgroup (%v)", err)
		}
	}
	return nil
}

// cstats are a container cgroup's counters.
type cstats struct {
	cpu      time.Duration
	memory   int64
	oomKills int64
	pidsMax  int64
}

func (c *ccgroup) stats() cstats {
	var s cstats
	if c == nil {
		return s
	}
	if d, ok := c.v1["memory"]; ok {
		s.memory, _ = readInt(filepath.Join(d, "memory.usage_in_bytes"))
		s.oomKills = readKey(filepath.Join(d, "memory.oom_control"), "oom_kill")
	} else if c.v2 != "" {
		s.memory, _ = readInt(filepath.Join(c.v2, "memory.current"))
		s.oomKills = readKey(filepath.Join(c.v2, "memory.events"), "oom_kill")
	}
	if p := c.file("pids", "pids.events", "pids.events"); p != "" {
		s.pidsMax = readKey(p, "max")
	}
	if d, ok := c.v1["cpuacct"]; ok {
		ns, _ := readInt(filepath.Join(d, "cpuacct.usage"))
		s.cpu = time.Duration(ns)
	} else if c.v2 != "" {
		s.cpu = time.Duration(readKey(filepath.Join(c.v2, "cpu.stat"), "usage_usec")) * time.Microsecond
	}
	return s
}

// attribute compares the counters with before: a memory kill or a refused
// fork during the command is the launch's limit stopping it.
func (c *ccgroup) attribute(before cstats) *mechanism.LimitExceededError {
	if c == nil {
		return nil
	}
	after := c.stats()
	if d := after.oomKills - before.oomKills; d > 0 {
		return &mechanism.LimitExceededError{Limit: mechanism.LimitMemory, Evidence: fmt.Sprintf("oom_kill +%d in the container's memory cgroup", d)}
	}
	if d := after.pidsMax - before.pidsMax; d > 0 {
		return &mechanism.LimitExceededError{Limit: mechanism.LimitPids, Evidence: fmt.Sprintf("pids.events max +%d: forks refused by pids.max", d)}
	}
	return nil
}

// procs lists the host pids in the container's cgroup.
func (c *ccgroup) procs() []int {
	var dir string
	for _, ctrl := range []string{"pids", "memory", "cpu", "freezer"} {
		if d, ok := c.v1[ctrl]; ok {
			dir = d
			break
		}
	}
	if dir == "" {
		dir = c.v2
	}
	return cgroups.Procs(dir)
}

// hostPid maps a pid of the container's pid namespace to the host pid,
// among the processes of the container's cgroup (runc-style runtimes,
// whose workloads are host processes).
func (c *ccgroup) hostPid(inner int) int {
	if c == nil || inner <= 0 {
		return 0
	}
	for _, p := range c.procs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "NSpid:") {
				continue
			}
			f := strings.Fields(line)
			if len(f) >= 3 && f[len(f)-1] == strconv.Itoa(inner) {
				return p
			}
		}
	}
	return 0
}

func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
