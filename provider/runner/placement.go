package runner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Placement: where a new sandbox goes among an account's online runners.
//
// The policy, in order:
//
//  1. Eligible: the runner is online, not cordoned or draining (the
//     application's Schedule), and its labels (the daemon's --label, with
//     the operator's on top) match the create's selector.
//  2. Fits: each limit the create asks (memory, CPU, disk) plus what the
//     runner already holds (Used: the limits of the sandbox records on it,
//     which the application counts) is within what the runner reports
//     (Capacity: memory_bytes, cpus×1000 millicores, disk_bytes; and
//     max_sandboxes for the count); memory asked is also within
//     memory_available and disk within disk_free, what the host has now.
//     A figure the runner does not report (Fountain's daemon, or one it
//     could not read) bounds nothing.
//  3. Score, lowest first (spread, least loaded): the largest of the
//     shares memory, CPU, disk and sandboxes would be at after placing
//     (each used+asked over capacity; a limit not asked counts as nothing
//     but the sandbox itself still counts toward max_sandboxes), plus the
//     load average per CPU over four (a busy host loses a tie, an idle
//     one wins it), plus a thousandth per sandbox already there (so empty
//     runners fill evenly when nothing is asked or reported). Ties go to
//     the runner id, so every replica orders the same runners alike.
//  4. Prefer: when asked (the account's last runner), that runner comes
//     first if it is eligible and fits, whatever its score.
//
// Place returns the eligible runners that fit, best first; the
// application inserts the record on the first whose room still holds
// under its lock (platform/store's InsertSandboxWithin, the truth across
// replicas) and tries the next when a race filled it. When nothing fits,
// the error is a *NoFitError naming, per runner, what did not fit.

// Selector is a create's runner selector: requirements that all hold,
// in the syntax of Kubernetes label selectors: "gpu=h100", "gpu==h100",
// "zone!=us", "zone in (eu,us)", "zone notin (ap)", "gpu" (has the
// label), "!gpu" (has not), joined by commas.
type Selector []Requirement

// Requirement is one term of a Selector.
type Requirement struct {
	Key    string   `json:"key"`
	Op     string   `json:"op"` // "=", "!=", "in", "notin", "exists", "!exists"
	Values []string `json:"values,omitempty"`
}

// MaxSelector bounds a selector's text.
const MaxSelector = 4 << 10

// ParseSelector reads a selector; "" selects every runner.
func ParseSelector(s string) (Selector, error) {
	if len(s) > MaxSelector {
		return nil, fmt.Errorf("runner selector is longer than %d", MaxSelector)
	}
	var out Selector
	rest := strings.TrimSpace(s)
	for rest != "" {
		// A term runs to the next comma outside parentheses.
		depth, end := 0, len(rest)
	scan:
		for i := 0; i < len(rest); i++ {
			switch rest[i] {
			case '(':
				depth++
			case ')':
				depth--
			case ',':
				if depth == 0 {
					end = i
					break scan
				}
			}
		}
		term := strings.TrimSpace(rest[:end])
		if end < len(rest) {
			rest = strings.TrimSpace(rest[end+1:])
			if rest == "" {
				return nil, fmt.Errorf("runner selector %q ends with a comma", s)
			}
		} else {
			rest = ""
		}
		r, err := parseRequirement(term)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseRequirement(t string) (Requirement, error) {
	bad := func(why string) (Requirement, error) {
		return Requirement{}, fmt.Errorf("runner selector term %q: %s", t, why)
	}
	if t == "" {
		return bad("empty")
	}
	if k, ok := strings.CutPrefix(t, "!"); ok {
		k = strings.TrimSpace(k)
		if err := wire.CheckLabel(k, ""); err != nil {
			return bad(err.Error())
		}
		return Requirement{Key: k, Op: "!exists"}, nil
	}
	for _, op := range []string{"!=", "==", "="} {
		if k, v, ok := strings.Cut(t, op); ok {
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if err := wire.CheckLabel(k, v); err != nil {
				return bad(err.Error())
			}
			if op == "==" {
				op = "="
			}
			return Requirement{Key: k, Op: op, Values: []string{v}}, nil
		}
	}
	if f := strings.Fields(t); len(f) >= 2 && (f[1] == "in" || f[1] == "notin") {
		k := f[0]
		list := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(t[len(f[0]):]), f[1]))
		if !strings.HasPrefix(list, "(") || !strings.HasSuffix(list, ")") {
			return bad("the values of in and notin go in parentheses: zone in (eu,us)")
		}
		var vals []string
		for _, v := range strings.Split(list[1:len(list)-1], ",") {
			v = strings.TrimSpace(v)
			if err := wire.CheckLabel(k, v); err != nil {
				return bad(err.Error())
			}
			vals = append(vals, v)
		}
		return Requirement{Key: k, Op: f[1], Values: vals}, nil
	}
	if err := wire.CheckLabel(t, ""); err != nil {
		return bad("not key=value, key!=value, key in (a,b), key notin (a,b), key or !key")
	}
	return Requirement{Key: t, Op: "exists"}, nil
}

// Matches reports whether labels satisfy every requirement.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s {
		v, has := labels[r.Key]
		switch r.Op {
		case "=":
			if !has || v != r.Values[0] {
				return false
			}
		case "!=":
			if has && v == r.Values[0] {
				return false
			}
		case "in":
			if !has || !slices.Contains(r.Values, v) {
				return false
			}
		case "notin":
			if has && slices.Contains(r.Values, v) {
				return false
			}
		case "exists":
			if !has {
				return false
			}
		case "!exists":
			if has {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// String is the selector in ParseSelector's syntax.
func (s Selector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		switch r.Op {
		case "exists":
			parts[i] = r.Key
		case "!exists":
			parts[i] = "!" + r.Key
		case "in", "notin":
			parts[i] = r.Key + " " + r.Op + " (" + strings.Join(r.Values, ",") + ")"
		default:
			parts[i] = r.Key + r.Op + r.Values[0]
		}
	}
	return strings.Join(parts, ",")
}

// Used is what the sandboxes on a runner ask together (their limits),
// as the application counts them from its records.
type Used struct {
	MemoryBytes int64
	CPUMillis   int64
	DiskBytes   int64
	Sandboxes   int64
}

// PlaceRequest is one placement.
type PlaceRequest struct {
	Limits   sandbox.Limits
	Selector Selector
	// Prefer is a runner id to put first when it is eligible and fits
	// (the account's last runner); "" prefers none.
	Prefer string
	// Schedule says why a runner takes no new sandbox ("cordoned",
	// "draining"), "" when it does; nil: every runner does.
	Schedule func(id string) string
	// Labels are the operator's labels of a runner, over its own; nil: none.
	Labels func(id string) map[string]string
	// Used is what a runner already holds; nil: nothing.
	Used func(id string) Used
	// Limit is how many candidates Place answers at most (the best
	// ones, in order); 0: all that fit.
	Limit int
}

// Candidate is a runner a sandbox fits on, with its score (lower is better).
type Candidate struct {
	Info  Info
	Score float64
}

// NoFitError is Place's refusal: no eligible runner, or none with room.
// Reason is "no_runner_fits" when no runner is eligible (selector,
// cordon), "resource_exhausted" when some were and none had room; Why
// says, per runner, what excluded it.
type NoFitError struct {
	Reason string
	Why    []RunnerMiss
}

// RunnerMiss is why one runner was not a candidate.
type RunnerMiss struct {
	Runner string `json:"runner"` // its name
	ID     string `json:"id"`
	Why    string `json:"why"`
}

func (e *NoFitError) Error() string {
	var b strings.Builder
	b.WriteString(e.Reason + ": no runner fits")
	for i, m := range e.Why {
		if i == 8 {
			fmt.Fprintf(&b, "; and %d more", len(e.Why)-i)
			break
		}
		fmt.Fprintf(&b, "; %s: %s", m.Runner, m.Why)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrNoFit) hold.
func (e *NoFitError) Is(target error) bool { return target == ErrNoFit }

// ErrNoFit matches every *NoFitError.
var ErrNoFit = errors.New("runner: no runner fits")

// effectiveLabels are a runner's labels with the operator's over them.
func effectiveLabels(r Info, extra func(string) map[string]string) map[string]string {
	if extra == nil {
		return r.Labels
	}
	op := extra(r.ID)
	if len(op) == 0 {
		return r.Labels
	}
	out := make(map[string]string, len(r.Labels)+len(op))
	for k, v := range r.Labels {
		out[k] = v
	}
	for k, v := range op {
		out[k] = v
	}
	return out
}

// Fit checks one runner for the request: "" when the sandbox fits, else
// what did not ("memory: 3.0 GiB asked, 1.5 GiB left of 4.0 GiB").
func Fit(r Info, lim sandbox.Limits, u Used) string {
	c := r.Capacity
	if c == nil {
		return ""
	}
	if c.MaxSandboxes > 0 && u.Sandboxes+1 > int64(c.MaxSandboxes) {
		return fmt.Sprintf("sandboxes: %d of at most %d", u.Sandboxes, c.MaxSandboxes)
	}
	if m := lim.MemoryBytes; m > 0 && c.MemoryBytes > 0 {
		if left := c.MemoryBytes - u.MemoryBytes; m > left {
			return fmt.Sprintf("memory: %s asked, %s left of %s", size(m), size(max(left, 0)), size(c.MemoryBytes))
		}
		if c.MemoryAvailable > 0 && m > c.MemoryAvailable {
			return fmt.Sprintf("memory: %s asked, %s available on the host now", size(m), size(c.MemoryAvailable))
		}
	}
	if m := int64(lim.CPUMillis); m > 0 && c.CPUs > 0 {
		if total := int64(c.CPUs) * 1000; u.CPUMillis+m > total {
			return fmt.Sprintf("cpu: %dm asked, %dm left of %d CPUs", m, max(total-u.CPUMillis, 0), c.CPUs)
		}
	}
	if d := lim.DiskBytes; d > 0 && c.DiskBytes > 0 {
		if left := c.DiskBytes - u.DiskBytes; d > left {
			return fmt.Sprintf("disk: %s asked, %s left of %s", size(d), size(max(left, 0)), size(c.DiskBytes))
		}
		if c.DiskFree > 0 && d > c.DiskFree {
			return fmt.Sprintf("disk: %s asked, %s free on the homes now", size(d), size(c.DiskFree))
		}
	}
	return ""
}

// Score is the policy's load of r after placing lim on it (see the
// policy above); lower is better.
func Score(r Info, lim sandbox.Limits, u Used) float64 {
	share := 0.0
	frac := func(used, asked, total int64) {
		if total > 0 {
			share = max(share, float64(used+asked)/float64(total))
		}
	}
	n := float64(u.Sandboxes)
	if c := r.Capacity; c != nil {
		frac(u.MemoryBytes, lim.MemoryBytes, c.MemoryBytes)
		frac(u.CPUMillis, int64(lim.CPUMillis), int64(c.CPUs)*1000)
		frac(u.DiskBytes, lim.DiskBytes, c.DiskBytes)
		frac(u.Sandboxes, 1, int64(c.MaxSandboxes))
		if c.CPUs > 0 {
			share += c.Load1 / float64(c.CPUs) / 4
		}
		n = max(n, float64(c.Sandboxes))
	}
	return share + n/1000
}

// Place orders rs for req: the eligible runners that fit, best first
// (the policy above), or a *NoFitError. One pass over rs: nothing is
// sorted but the (at most req.Limit) candidates kept, and the reasons of
// the runners left out are only written when nothing fits.
func Place(rs []Info, req PlaceRequest) ([]Candidate, error) {
	out, eligible := place(rs, req, nil)
	if len(out) > 0 {
		return out, nil
	}
	var miss []RunnerMiss
	place(rs, req, &miss)
	reason := "no_runner_fits"
	if eligible > 0 {
		reason = "resource_exhausted"
	}
	sort.Slice(miss, func(i, j int) bool { return miss[i].Runner < miss[j].Runner })
	return nil, &NoFitError{Reason: reason, Why: miss}
}

// better orders candidates: lower score, then runner id.
func better(a, b Candidate) bool {
	if a.Score != b.Score {
		return a.Score < b.Score
	}
	return a.Info.ID < b.Info.ID
}

// place is Place's pass: the candidates best first (at most req.Limit),
// how many runners were eligible, and, with miss, why each other was not.
func place(rs []Info, req PlaceRequest, miss *[]RunnerMiss) ([]Candidate, int) {
	var out []Candidate
	if req.Limit <= 0 {
		out = make([]Candidate, 0, len(rs))
	}
	eligible := 0
	var sel string
	for i := range rs {
		r := &rs[i]
		if req.Schedule != nil {
			if why := req.Schedule(r.ID); why != "" {
				if miss != nil {
					*miss = append(*miss, RunnerMiss{r.Name, r.ID, why})
				}
				continue
			}
		}
		if len(req.Selector) > 0 && !req.Selector.Matches(effectiveLabels(*r, req.Labels)) {
			if miss != nil {
				if sel == "" {
					sel = req.Selector.String()
				}
				*miss = append(*miss, RunnerMiss{r.Name, r.ID, "labels do not match " + sel})
			}
			continue
		}
		eligible++
		var u Used
		if req.Used != nil {
			u = req.Used(r.ID)
		}
		if why := Fit(*r, req.Limits, u); why != "" {
			if miss != nil {
				*miss = append(*miss, RunnerMiss{r.Name, r.ID, why})
			}
			continue
		}
		if miss != nil {
			continue
		}
		c := Candidate{Info: *r, Score: Score(*r, req.Limits, u)}
		if req.Prefer != "" && r.ID == req.Prefer {
			c.Score = math.Inf(-1)
		}
		if req.Limit > 0 && len(out) == req.Limit {
			if !better(c, out[len(out)-1]) {
				continue
			}
			out = out[:len(out)-1]
		}
		// Insert in order (a short list when Limit is set).
		j := len(out)
		out = append(out, c)
		for j > 0 && better(c, out[j-1]) {
			out[j] = out[j-1]
			j--
		}
		out[j] = c
	}
	return out, eligible
}

// size prints n bytes in the largest binary unit that keeps it ≥ 1.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 4 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGT"[u-1])
}

// Place orders the provider's online runners for req (Place's policy).
// With no runner online it is Unavailable{no_runner_online}.
func (p *Provider) Place(ctx context.Context, req PlaceRequest) ([]Candidate, error) {
	rs, err := p.Runners(ctx)
	if err != nil {
		return nil, err
	}
	return PlaceOnline(rs, req)
}

// PlaceOnline is Place over rs, the online runners: with none it is
// Unavailable{no_runner_online}.
func PlaceOnline(rs []Info, req PlaceRequest) ([]Candidate, error) {
	if len(rs) == 0 {
		return nil, sandbox.Unavailable("no_runner_online", nil)
	}
	return Place(rs, req)
}

// Runners are the runners the provider reaches that are online now.
func (p *Provider) Runners(ctx context.Context) ([]Info, error) { return p.c.Runners(ctx) }

// NamesPrefix is the prefix every sandbox name For mints on runnerID
// carries ("runner-<32 hex>-"): an application counts a runner's
// sandboxes by the records whose names start with it.
func NamesPrefix(runnerID string) (string, error) {
	n, err := For(runnerID)
	if err != nil {
		return "", err
	}
	return n[:len(n)-8], nil
}
