package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/managoat/managoat/sandbox"
)

type lsRow struct {
	Name      string         `json:"name"`
	Provider  string         `json:"provider"`
	Status    sandbox.Status `json:"status"`
	State     string         `json:"state,omitempty"` // the provider's own word, when it gives one
	Error     string         `json:"error,omitempty"`
	Mechanism string         `json:"mechanism,omitempty"`
	CreatedAt *time.Time     `json:"created_at,omitempty"`
	// Limits are the sandbox's limits, when its provider says them.
	Limits map[string]any    `json:"limits,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Image is the image it was created from, when its provider says it
	// (through the platform: the record's).
	Image string `json:"image,omitempty"`
	// DiskUsed is what the sandbox's home holds, when its provider says
	// it cheaply (a home with a quota of its own file system).
	DiskUsed *int64 `json:"disk_used_bytes,omitempty"`
	// EgressAllow is the allow list in force, when its provider says it
	// (absent: none, every public destination; empty: nothing).
	EgressAllow *[]string `json:"egress_allow,omitempty"`
}

// labelFlags collects --label k=v.
type labelFlags struct{ multiFlag }

func (l *labelFlags) labels() (map[string]string, error) {
	if len(l.multiFlag) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range l.multiFlag {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{msg: fmt.Sprintf("--label %q is not KEY=VALUE", kv)}
		}
		m[k] = v
	}
	return m, nil
}

// filter is one ls --filter: label=KEY (the label is set) or
// label=KEY=VALUE (set to VALUE).
type filter struct {
	key, value string
	anyValue   bool
}

func parseFilters(fs []string) ([]filter, error) {
	var out []filter
	for _, f := range fs {
		kv, ok := strings.CutPrefix(f, "label=")
		if !ok || kv == "" {
			return nil, usageError{msg: fmt.Sprintf("--filter %q: the filter is label=KEY or label=KEY=VALUE", f)}
		}
		k, v, hasValue := strings.Cut(kv, "=")
		out = append(out, filter{k, v, !hasValue})
	}
	return out, nil
}

func (f filter) match(labels map[string]string) bool {
	v, ok := labels[f.key]
	return ok && (f.anyValue || v == f.value)
}

func cmdLs(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, true)
	var filters multiFlag
	fs.Var(&filters, "filter", "only sandboxes with a label: `label=KEY=VALUE` or label=KEY (repeatable: all must match)")
	quiet := fs.Bool("q", false, "print only the sandboxes' names, one a line (for scripts and shell completion)")
	fs.BoolVar(quiet, "quiet", false, "the same as -q")
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		fl, err := parseFilters(filters)
		if err != nil {
			return err
		}
		reg, p, err := openProvider(g.provider)
		if err != nil {
			return err
		}
		var names []string
		var failed []sandbox.ListPart
		if pl, ok := p.(sandbox.PartialLister); ok {
			// Each source (runner) apart: the ones that answer are shown,
			// the others named, never the whole listing lost to one.
			parts, err := pl.ListParts(ctx)
			if err != nil {
				return wrap("ls", err)
			}
			for _, part := range parts {
				if part.Err != nil {
					failed = append(failed, part)
					continue
				}
				names = append(names, part.Names...)
			}
		} else if names, err = reg.ListAllNames(ctx, p.Name()); err != nil {
			return wrap("ls", err)
		}
		if *quiet && len(fl) == 0 {
			// The names alone need no look-up of each sandbox.
			for _, n := range names {
				fmt.Println(cell(n))
			}
			return incomplete(failed)
		}
		rows := make([]lsRow, 0, len(names))
		for _, n := range names {
			row := lsRow{Name: n, Provider: p.Name()}
			info, err := reg.Get(ctx, sandbox.BuildHandle(p.Name(), n))
			switch {
			case errors.Is(err, sandbox.ErrNotFound):
				continue // gone between the listing and the look-up
			case err != nil:
				row.Status, row.Error = sandbox.StatusUnknown, err.Error()
			default:
				row.Status = info.Status
				var raw struct {
					State     string            `json:"state"`
					Limits    map[string]any    `json:"limits"`
					Mechanism string            `json:"mechanism"`
					CreatedAt time.Time         `json:"created_at"`
					Labels    map[string]string `json:"labels"`
					Image     string            `json:"image"`
					DiskUsed  *int64            `json:"disk_used_bytes"`
					Allow     *[]string         `json:"egress_allow"`
				}
				if where := platformProviderOf(p, info.Raw); where != "" {
					row.Provider = where // through the platform: where it lives
				}
				if json.Unmarshal(info.Raw, &raw) == nil {
					if raw.State != string(info.Status) {
						row.State = raw.State
					}
					row.Limits, row.Mechanism, row.Labels, row.DiskUsed, row.EgressAllow = raw.Limits, raw.Mechanism, raw.Labels, raw.DiskUsed, raw.Allow
					row.Image = raw.Image
					if !raw.CreatedAt.IsZero() {
						t := raw.CreatedAt.UTC()
						row.CreatedAt = &t
					}
				}
			}
			if !slices.ContainsFunc(fl, func(f filter) bool { return !f.match(row.Labels) }) {
				rows = append(rows, row)
			}
		}
		switch {
		case *quiet:
			for _, r := range rows {
				fmt.Println(cell(r.Name))
			}
		case of.json():
			if err := json.NewEncoder(os.Stdout).Encode(rows); err != nil {
				return err
			}
		default:
			if err := lsTable(rows, of.isWide(), isPlatform(p)); err != nil {
				return err
			}
		}
		return incomplete(failed)
	}
}

// incomplete is ls's error when a source did not answer: what was listed
// is shown, and the listing's being incomplete is said by the exit code
// (as kubectl's partial results do), with the sources named.
func incomplete(failed []sandbox.ListPart) error {
	if len(failed) == 0 {
		return nil
	}
	var why []string
	for _, f := range failed {
		why = append(why, fmt.Sprintf("%s did not answer (%v)", f.Source, f.Err))
	}
	return wrap("ls", fmt.Errorf("the listing is incomplete: %s: %w", strings.Join(why, "; "), sandbox.ErrTruncated))
}

// lsTable prints rows; withProvider adds the PROVIDER column to the narrow
// table (a platform's sandboxes live on several providers).
func lsTable(rows []lsRow, wide, withProvider bool) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	switch {
	case wide:
		fmt.Fprintln(tw, "NAME\tSTATUS\tSTATE\tMEMORY\tPIDS\tCPU\tDISK\tTIMEOUT\tPROVIDER\tMECHANISM\tCREATED\tLABELS\tALLOW")
	case withProvider:
		fmt.Fprintln(tw, "NAME\tSTATUS\tSTATE\tPROVIDER")
	default:
		fmt.Fprintln(tw, "NAME\tSTATUS\tSTATE")
	}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return cell(s) // what a provider said is one cell (output.go)
	}
	for _, r := range rows {
		if !wide && withProvider {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(r.Name), r.Status, dash(r.State), cell(r.Provider))
			continue
		}
		if !wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", cell(r.Name), r.Status, dash(r.State))
			continue
		}
		lim := func(k string) string {
			v, ok := r.Limits[k]
			if !ok {
				return "-"
			}
			if f, ok := v.(float64); ok {
				switch k {
				case "memory_bytes", "disk_bytes":
					return fmt.Sprintf("%dM", int64(f)>>20)
				case "cpu_millis":
					return fmt.Sprintf("%dm", int64(f))
				}
				return fmt.Sprintf("%d", int64(f))
			}
			return fmt.Sprint(v)
		}
		created := "-"
		if r.CreatedAt != nil {
			created = r.CreatedAt.Local().Format(time.DateTime)
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
			labels = append(labels, k+"="+r.Labels[k])
		}
		// DISK: the home's quota, with what it holds before it (USED/LIMIT)
		// when the provider says it.
		disk := lim("disk_bytes")
		if r.DiskUsed != nil && disk != "-" {
			disk = fmt.Sprintf("%dM/%s", (*r.DiskUsed+1<<20-1)>>20, disk)
		}
		// ALLOW: the egress allow list ("-": none, every public
		// destination; "none": all denied).
		allow := "-"
		if r.EgressAllow != nil {
			if allow = strings.Join(*r.EgressAllow, ","); allow == "" {
				allow = "none"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(r.Name), r.Status, dash(r.State),
			lim("memory_bytes"), lim("pids"), lim("cpu_millis"), disk, lim("wall_clock"),
			cell(r.Provider), dash(r.Mechanism), created, dash(strings.Join(labels, ",")), cell(allow))
	}
	return tw.Flush()
}
