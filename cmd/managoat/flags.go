package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/provider/local/journal"
	"github.com/managoat/managoat/sandbox"
)

// globals are the flags every command accepts.
type globals struct {
	provider  string
	mechanism string
	// ephemeral is set by run: the local provider then starts no
	// supervisor unless the command needs one.
	ephemeral bool
	// retention is set by create's --journal-max-size/--journal-max-age.
	retention *journal.Retention
	// providerChosen is set when the provider was chosen by the
	// configuration file or MANAGOAT_PROVIDER (a --provider is seen in
	// sets, the FlagSets flagSet made for this invocation).
	providerChosen bool
	sets           []*flag.FlagSet
}

// chosenProvider reports whether the provider was chosen (--provider,
// MANAGOAT_PROVIDER, the configuration file, or the platform's variables)
// rather than left at its default.
func (g *globals) chosenProvider() bool {
	given := g.providerChosen
	for _, fs := range g.sets {
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "provider" })
	}
	return given
}

// The global flags' defaults.
const (
	defaultProvider  = "local"
	defaultMechanism = "jail"
)

// flagSet is a FlagSet holding the global flags, with g's values as their
// defaults (so that a command's FlagSet keeps what the global one set);
// the help is printed by run, from the FlagSet, not by the flag package.
func (g *globals) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&g.provider, "provider", g.provider, "sandbox provider")
	fs.StringVar(&g.mechanism, "mechanism", g.mechanism, "isolation mechanism for the local provider: jail, trusted, oci (runc) or oci:runsc")
	g.sets = append(g.sets, fs)
	return fs
}

// parse parses args with fs, turning flag errors into usage errors; a -h
// or --help is flag.ErrHelp, for run to print the command's help.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{msg: err.Error()}
	}
	return nil
}

// parseN parses flags interleaved with up to n positional arguments (so
// both "exec --timeout 5s NAME -- CMD" and "exec NAME --timeout 5s -- CMD"
// work), and returns those positionals and whatever follows them: after the
// nth positional, flag parsing stops at the first non-flag and a "--" is
// consumed. n < 0 takes every argument as a positional.
func parseN(fs *flag.FlagSet, args []string, n int) (pos, rest []string, err error) {
	for {
		if err := parse(fs, args); err != nil {
			return nil, nil, err
		}
		args = fs.Args()
		if len(args) == 0 || (n >= 0 && len(pos) == n) {
			return pos, args, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
		if n >= 0 && len(pos) == n {
			if err := parse(fs, args); err != nil {
				return nil, nil, err
			}
			return pos, fs.Args(), nil
		}
	}
}

// The bounds of --memory and --pids: less memory cannot start a process,
// and Linux has no more pids (PID_MAX_LIMIT on 64-bit).
const (
	minMemory = 1 << 20
	maxPids   = 1 << 22
	minDisk   = 1 << 20 // the smallest home quota (mechanism/internal/diskquota)
)

// limitFlags collects --memory, --pids, --cpu, --disk and --timeout.
type limitFlags struct {
	memory, pids, cpu, disk, timeout string
}

func (l *limitFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&l.memory, "memory", "", "memory limit, e.g. 512M or 2G")
	fs.StringVar(&l.pids, "pids", "", "maximum number of processes")
	fs.StringVar(&l.cpu, "cpu", "", "CPU limit in cores, e.g. 0.5 or 500m")
	fs.StringVar(&l.disk, "disk", "", "what the sandbox's home may hold, e.g. 1G (a disk quota; local provider as root)")
	fs.StringVar(&l.timeout, "timeout", "", "wall-clock budget per command, e.g. 30s")
}

func (l *limitFlags) limits() (sandbox.Limits, error) {
	var out sandbox.Limits
	var err error
	if l.memory != "" {
		if out.MemoryBytes, err = parseSize(l.memory); err != nil {
			return out, usageError{msg: "--memory: " + err.Error()}
		}
		if out.MemoryBytes < minMemory {
			return out, usageError{msg: fmt.Sprintf("--memory: %s is less than 1M, too little to start a process", l.memory)}
		}
	}
	if l.pids != "" {
		n, err := strconv.Atoi(l.pids)
		if err != nil || n <= 0 || n > maxPids {
			return out, usageError{msg: fmt.Sprintf("--pids: %q is not an integer from 1 to %d", l.pids, maxPids)}
		}
		out.Pids = n
	}
	if l.cpu != "" {
		if out.CPUMillis, err = parseCPU(l.cpu); err != nil {
			return out, usageError{msg: "--cpu: " + err.Error()}
		}
	}
	if l.disk != "" {
		if out.DiskBytes, err = parseSize(l.disk); err != nil {
			return out, usageError{msg: "--disk: " + err.Error()}
		}
		if out.DiskBytes < minDisk {
			return out, usageError{msg: fmt.Sprintf("--disk: %s is less than 1M, too little for a file system", l.disk)}
		}
	}
	if l.timeout != "" {
		d, err := time.ParseDuration(l.timeout)
		if err != nil || d <= 0 {
			return out, usageError{msg: fmt.Sprintf("--timeout: %q is not a positive duration such as 30s", l.timeout)}
		}
		out.WallClock = d
	}
	return out, nil
}

// parseSize reads 1024, 64K, 512M, 2G (powers of 1024; a trailing B or iB
// is accepted).
func parseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		case 'T':
			mult, t = 1<<40, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || v*float64(mult) > 1<<50 { // !(v > 0) refuses NaN too
		return 0, fmt.Errorf("%q is not a size such as 512M or 2G", s)
	}
	return int64(v * float64(mult)), nil
}

// parseCPU reads cores ("0.5", "2") or millicores ("500m").
func parseCPU(s string) (int, error) {
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.Atoi(m)
		if err != nil || n <= 0 || n > 1024*1000 {
			return 0, fmt.Errorf("%q is not a CPU amount such as 0.5 or 500m", s)
		}
		return n, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || v > 1024 { // !(v > 0) refuses NaN too
		return 0, fmt.Errorf("%q is not a CPU amount such as 0.5 or 500m", s)
	}
	if v < 0.001 {
		return 0, fmt.Errorf("%q is less than 1m, the smallest CPU amount", s)
	}
	return int(v*1000 + 0.5), nil
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
