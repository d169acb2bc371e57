package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Owner is this process's owner label (LabelOwner): the boot's id, the
// pid and the process's start time, so a pid reused since, or one of
// another boot, is never taken for this process.
func Owner() string { return ownerOnce() }

var ownerOnce = sync.OnceValue(func() string { return ownerOf(os.Getpid()) })

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// ownerOf is the owner label of pid, "" when it is not running.
func ownerOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name is in parentheses and may hold anything: the
	// fields after its last ")" are the ones counted.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return bootID() + ":" + strconv.Itoa(pid) + ":" + f[19] // starttime, field 22
}

// alive reports whether the owner label names a running process.
func alive(owner string) bool {
	parts := strings.Split(owner, ":")
	if len(parts) != 3 || parts[0] != bootID() {
		return false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return false
	}
	return ownerOf(pid) == owner
}

// Sweep destroys what a server that vanished (killed before it could end
// its sessions) left on provider: every sandbox named NamePrefix... whose
// LabelOwner names a process no longer running on this machine. Sandboxes
// without the label, and those of a running owner, are kept. It returns
// how many it destroyed. Only a provider that keeps labels (local) has
// anything to sweep.
func Sweep(ctx context.Context, reg *sandbox.Registry, provider string) (int, error) {
	names, err := reg.ListAllNames(ctx, provider)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, name := range names {
		if !strings.HasPrefix(name, NamePrefix) {
			continue
		}
		h := sandbox.BuildHandle(provider, name)
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := reg.Get(gctx, h)
		cancel()
		if err != nil {
			continue
		}
		var raw struct {
			Labels map[string]string `json:"labels"`
		}
		if json.Unmarshal(info.Raw, &raw) != nil {
			continue
		}
		owner, ok := raw.Labels[LabelOwner]
		if !ok || raw.Labels[LabelSession] == "" || alive(owner) {
			continue
		}
		if err := reg.Destroy(ctx, h); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
