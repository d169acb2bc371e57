// Safety checks of the commands that could lose work: create adopting an
// existing sandbox only when nothing asked differs, rm naming the sessions
// still running.

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// createConflict compares the options create was given (only those given)
// with those of the existing sandbox h and names each difference: an
// existing sandbox is adopted only when nothing asked differs from it.
func createConflict(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, fs *flag.FlagSet, opts sandbox.CreateOptions) error {
	info, err := reg.Get(ctx, h)
	if err != nil {
		return nil // absent (or unknown): Create decides
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var raw struct {
		Limits map[string]any    `json:"limits"`
		Env    []string          `json:"env"`
		Dir    string            `json:"dir"`
		Labels map[string]string `json:"labels"`
		Mounts []sandbox.Mount   `json:"mounts"`
	}
	_ = json.Unmarshal(info.Raw, &raw)
	var diffs []string
	// A limit the provider leaves out of a listing it gives is 0 (none).
	known := raw.Limits != nil
	num := func(k string) int64 {
		f, _ := raw.Limits[k].(float64)
		return int64(f)
	}
	differs := func(flagName, what string, want, have any) {
		if !given[flagName] {
			return
		}
		if !known {
			diffs = append(diffs, fmt.Sprintf("%s %v asked, and the provider does not say the existing one's", what, want))
			return
		}
		if fmt.Sprint(want) != fmt.Sprint(have) {
			diffs = append(diffs, fmt.Sprintf("%s %v asked, the existing one has %v", what, want, have))
		}
	}
	l := opts.Limits
	differs("memory", "memory bytes", l.MemoryBytes, num("memory_bytes"))
	differs("pids", "pids", l.Pids, num("pids"))
	differs("cpu", "cpu millicores", l.CPUMillis, num("cpu_millis"))
	wall, _ := raw.Limits["wall_clock"].(string)
	d, _ := time.ParseDuration(wall)
	differs("timeout", "timeout", l.WallClock, d)
	if given["e"] || given["env"] || given["env-file"] {
		if !slices.Equal(opts.Env, raw.Env) {
			diffs = append(diffs, fmt.Sprintf("environment %q asked, the existing one has %q", opts.Env, raw.Env))
		}
	}
	if given["label"] && !maps.Equal(opts.Labels, raw.Labels) {
		diffs = append(diffs, fmt.Sprintf("labels %v asked, the existing one has %v", opts.Labels, raw.Labels))
	}
	if (given["v"] || given["volume"]) && !slices.Equal(opts.Mounts, raw.Mounts) {
		diffs = append(diffs, fmt.Sprintf("mounts %v asked, the existing one has %v", opts.Mounts, raw.Mounts))
	}
	if given["w"] || given["dir"] {
		if opts.Dir != raw.Dir {
			diffs = append(diffs, fmt.Sprintf("working directory %q asked, the existing one has %q", opts.Dir, raw.Dir))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("sandbox %q exists with other options (%s); rm it first, or create it without options to use it as it is: %w",
		h.Name, strings.Join(diffs, "; "), sandbox.ErrAlreadyExists)
}

// runningSessions lists the ids of h's sessions its provider says are
// running.
func runningSessions(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) []string {
	ss, err := reg.ListSessions(ctx, h)
	if err != nil {
		return nil
	}
	var ids []string
	for _, s := range ss {
		if s.State == sandbox.SessionRunning {
			ids = append(ids, s.ID)
		}
	}
	return ids
}
