package runner

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/runner/wire"
)

// capacity answers wire.OpCapacity: this host's CPUs (runtime.NumCPU, the
// CPUs this process may run on), memory (/proc/meminfo's MemTotal and
// MemAvailable), the homes' file system (statfs: its size and what is
// free to unprivileged users), the 1-minute load average (/proc/loadavg),
// and the provider's sandboxes (ListAllNames), of which those with a
// session this daemon holds unfinished count as running, the rest idle.
// Config.CapacityMemory, CapacityDisk and CapacityCPUs, when set, replace
// the host's figure (an operator keeping room for the host's own work, or
// a host shared with other things); Config.MaxSandboxes is reported as it
// is. A figure that cannot be read is left out (zero), never guessed.
func (d *Daemon) capacity(ctx context.Context) (*wire.Capacity, error) {
	c := &wire.Capacity{CPUs: runtime.NumCPU(), MaxSandboxes: max(d.cfg.MaxSandboxes, 0)}
	if total, avail, err := meminfo(); err == nil {
		c.MemoryBytes, c.MemoryAvailable = total, avail
	}
	if dir := d.homesDir(); dir != "" {
		var fs unix.Statfs_t
		if unix.Statfs(dir, &fs) == nil {
			c.DiskBytes = int64(fs.Blocks) * fs.Bsize
			c.DiskFree = int64(fs.Bavail) * fs.Bsize
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil && v >= 0 {
				c.Load1 = v
			}
		}
	}
	if d.cfg.CapacityCPUs > 0 {
		c.CPUs = d.cfg.CapacityCPUs
	}
	if d.cfg.CapacityMemory > 0 {
		c.MemoryBytes = d.cfg.CapacityMemory
		c.MemoryAvailable = min(c.MemoryAvailable, d.cfg.CapacityMemory)
		if c.MemoryAvailable == 0 {
			c.MemoryAvailable = d.cfg.CapacityMemory
		}
	}
	if d.cfg.CapacityDisk > 0 {
		c.DiskBytes = d.cfg.CapacityDisk
		c.DiskFree = min(c.DiskFree, d.cfg.CapacityDisk)
	}
	names, err := d.p.ListAllNames(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the sandboxes: %w", err)
	}
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	running := map[string]bool{}
	d.mu.Lock()
	live := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		live = append(live, s)
	}
	d.mu.Unlock()
	for _, s := range live {
		if have[s.name] && !s.finished() {
			running[s.name] = true
		}
	}
	c.Sandboxes, c.Running = len(names), len(running)
	c.Idle = c.Sandboxes - c.Running
	return c, nil
}

// meminfo reads MemTotal and MemAvailable, in bytes.
func meminfo() (total, avail int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || v < 0 {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("no MemTotal in /proc/meminfo")
	}
	return total, avail, nil
}
