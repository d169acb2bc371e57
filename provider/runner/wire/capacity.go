package wire

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Fleet extensions (placement by capacity and labels). Both are optional,
// so a platform and a daemon of either age still talk:
//
//   - ParamLabels, a handshake parameter: the runner's labels, key=value
//     pairs joined by commas (ParseLabels checks them). Fountain's platform
//     ignores an unknown query parameter.
//   - OpCapacity, an op sent only to a daemon that reported CapCapacity in
//     its caps: no fields; the reply's result is a Capacity. The platform
//     asks it when the runner connects and at every heartbeat, so what it
//     places by is at most one heartbeat interval old. Fountain's daemon
//     never reports the capability and is never asked; the platform places
//     on it by its sandbox records alone.
const (
	ParamLabels = "labels"
	OpCapacity  = "capacity"
	CapCapacity = "capacity"
)

// Capacity is a runner's report of its host: what it has (CPUs, memory,
// the disk of the homes) and what is in use. Zero is "not reported".
type Capacity struct {
	CPUs            int     `json:"cpus,omitempty"`
	MemoryBytes     int64   `json:"memory_bytes,omitempty"`     // MemTotal, or the daemon's --capacity-memory
	MemoryAvailable int64   `json:"memory_available,omitempty"` // MemAvailable
	DiskBytes       int64   `json:"disk_bytes,omitempty"`       // the homes' file system, or --capacity-disk
	DiskFree        int64   `json:"disk_free,omitempty"`        // free to unprivileged users
	Load1           float64 `json:"load1,omitempty"`            // 1-minute load average
	Sandboxes       int     `json:"sandboxes"`                  // the provider's sandboxes, running and idle
	Running         int     `json:"running"`                    // those with a session the daemon holds running
	Idle            int     `json:"idle"`                       // the others
	MaxSandboxes    int     `json:"max_sandboxes,omitempty"`    // the daemon's --max-sandboxes; 0 none
}

// Validate refuses a report no host makes (negative figures, more running
// than there are): the platform drops such a report and keeps the last.
func (c *Capacity) Validate() error {
	if c.CPUs < 0 || c.CPUs > 1<<16 || c.MemoryBytes < 0 || c.MemoryAvailable < 0 || c.DiskBytes < 0 || c.DiskFree < 0 ||
		c.Load1 < 0 || math.IsNaN(c.Load1) || c.Load1 > 1e9 || c.Sandboxes < 0 || c.Running < 0 || c.Idle < 0 || c.MaxSandboxes < 0 ||
		c.Running+c.Idle > c.Sandboxes {
		return errors.New("wire: capacity report out of range")
	}
	return nil
}

// Label bounds: at most MaxLabels pairs; keys of 1 to 63 characters of
// lowercase letters, digits, '.', '_', '-' and '/' (starting with a letter
// or digit); values of at most 63 such characters (uppercase allowed) or
// empty.
const MaxLabels = 32

// ParseLabels reads a ParamLabels value (or a list of "key=value" flags
// joined by commas). An empty string is no labels.
func ParseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxLabels {
		return nil, fmt.Errorf("more than %d labels", MaxLabels)
	}
	out := make(map[string]string, len(parts))
	for _, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", clip(p, 70))
		}
		if err := CheckLabel(k, v); err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// FormatLabels is ParseLabels' inverse, keys sorted.
func FormatLabels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}

// CheckLabel checks one label's key and value against the bounds above.
func CheckLabel(k, v string) error {
	if len(k) == 0 || len(k) > 63 || !labelChar(k[0], false) || k[0] == '.' || k[0] == '_' || k[0] == '-' || k[0] == '/' {
		return fmt.Errorf("label key %q must be 1 to 63 lowercase letters, digits, '.', '_', '-' or '/', starting with a letter or digit", clip(k, 70))
	}
	for i := 0; i < len(k); i++ {
		if !labelChar(k[i], false) {
			return fmt.Errorf("label key %q must be 1 to 63 lowercase letters, digits, '.', '_', '-' or '/', starting with a letter or digit", clip(k, 70))
		}
	}
	if len(v) > 63 {
		return fmt.Errorf("label %s's value is longer than 63", k)
	}
	for i := 0; i < len(v); i++ {
		if !labelChar(v[i], true) || v[i] == '/' {
			return fmt.Errorf("label %s's value %q must be letters, digits, '.', '_' or '-'", k, clip(v, 70))
		}
	}
	return nil
}

func labelChar(c byte, upper bool) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/' || upper && 'A' <= c && c <= 'Z'
}
