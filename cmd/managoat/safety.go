package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("completion", "bash|zsh|fish", "Print a shell completion script (e.g. source <(managoat completion bash))", cmdCompletion)
}

// envProvider is the environment variable naming the default provider, so
// that --provider is not needed on every call.
const envProvider = "MANAGOAT_PROVIDER"

// configPath is managoat's configuration file: $MANAGOAT_CONFIG, else
// $XDG_CONFIG_HOME/managoat/config, else ~/.config/managoat/config.
func configPath() string {
	if p := os.Getenv("MANAGOAT_CONFIG"); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "managoat", "config")
}

// defaultsFromEnv sets g's provider and mechanism from the configuration
// file (lines "provider = NAME", "mechanism = NAME", # comments), then
// the provider from MANAGOAT_PROVIDER; --provider and --mechanism still
// win. A line the file should not hold is ignored: the file is only
// defaults.
func defaultsFromEnv(g *globals) {
	if path := configPath(); path != "" {
		if b, err := os.ReadFile(path); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				k, v, ok := strings.Cut(line, "=")
				if !ok || strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue
				}
				switch v = strings.TrimSpace(v); strings.TrimSpace(k) {
				case "provider":
					g.provider, g.providerChosen = v, true
				case "mechanism":
					g.mechanism = v
				}
			}
		}
	}
	if p := os.Getenv(envProvider); p != "" {
		g.provider, g.providerChosen = p, true
	}
}

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

// buildVersion is managoat's version: the -ldflags one when set, else the
// module's version and the VCS revision the build info holds.
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if v == "dev" && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	out := v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += " (revision " + rev
		if modified {
			out += ", modified"
		}
		if at != "" {
			out += ", " + at
		}
		out += ")"
	}
	return out + " " + bi.GoVersion
}

func cmdVersion(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
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
		if of.json() {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"version": buildVersion()})
		}
		fmt.Println("managoat", buildVersion())
		return nil
	}
}

// namesSandbox reports whether c's first argument (after a subcommand)
// is an existing sandbox's name, which completion offers from ls -q.
func namesSandbox(c command) bool {
	syn := strings.TrimPrefix(c.synopsis, "create|ls|restore ")
	syn = strings.TrimPrefix(syn, "[flags] ")
	return strings.HasPrefix(syn, "NAME") && c.name != "create" && c.name != "enroll"
}

// subcommandsOf is what completion offers beside the names for a command
// with subcommands ("" or words ending in a space).
func subcommandsOf(name string) string {
	if name == "checkpoint" {
		return "create ls restore "
	}
	return ""
}

// cmdCompletion prints a completion script for bash, zsh or fish, made
// from the command registry: each command's name and flags.
func cmdCompletion(g *globals, fs *flag.FlagSet) action {
	return func(ctx context.Context, args []string) error {
		pos, rest, err := positionals(fs, args, 1, "the shell: bash, zsh or fish")
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		var names []string
		flagsOf := map[string][]string{}
		takesName := map[string]bool{}
		for _, c := range commands {
			names = append(names, c.name)
			takesName[c.name] = namesSandbox(c)
			cfs := (&globals{}).flagSet(c.name)
			c.setup(&globals{}, cfs)
			cfs.VisitAll(func(f *flag.Flag) {
				dash := "--"
				if len(f.Name) == 1 {
					dash = "-"
				}
				flagsOf[c.name] = append(flagsOf[c.name], dash+f.Name)
			})
		}
		w := os.Stdout
		switch pos[0] {
		case "bash":
			fmt.Fprintln(w, "# bash completion for managoat: source <(managoat completion bash)")
			fmt.Fprintln(w, "_managoat() {")
			fmt.Fprintln(w, `  local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" i dashes="" pv=()`)
			// The command is the first word that is not a flag or a global
			// flag's value; --provider's value is kept for the names' ls.
			fmt.Fprintln(w, `  for ((i = 1; i < COMP_CWORD; i++)); do case "${COMP_WORDS[i]}" in`)
			fmt.Fprintln(w, `    --) [[ -n $cmd ]] && dashes=1 ;;`)
			fmt.Fprintln(w, `    --provider|--mechanism) [[ ${COMP_WORDS[i]} == --provider ]] && pv=(--provider "${COMP_WORDS[i+1]}"); [[ -z $cmd ]] && ((i++)) ;;`)
			fmt.Fprintln(w, `    --provider=*) pv=("${COMP_WORDS[i]}") ;;`)
			fmt.Fprintln(w, `    -*) ;;`)
			fmt.Fprintln(w, `    *) [[ -z $cmd ]] && cmd="${COMP_WORDS[i]}" ;;`)
			fmt.Fprintln(w, `  esac; done`)
			fmt.Fprintln(w, `  case "$cmd" in`)
			fmt.Fprintf(w, "    \"\") COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(append(names, "--provider", "--mechanism"), " "))
			for _, n := range names {
				if !takesName[n] {
					fmt.Fprintf(w, "    %s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", n, strings.Join(flagsOf[n], " "))
					continue
				}
				// A sandbox's name, from managoat ls -q (before any --).
				fmt.Fprintf(w, "    %s) if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); "+
					"elif [[ -z $dashes ]]; then COMPREPLY=($(compgen -W \"%s$(\"${COMP_WORDS[0]}\" \"${pv[@]}\" ls -q 2>/dev/null)\" -- \"$cur\")); fi ;;\n",
					n, strings.Join(flagsOf[n], " "), subcommandsOf(n))
			}
			fmt.Fprintln(w, "  esac")
			fmt.Fprintln(w, "}")
			fmt.Fprintln(w, "complete -o default -F _managoat managoat")
		case "zsh":
			fmt.Fprintln(w, "#compdef managoat")
			fmt.Fprintln(w, "# zsh completion for managoat: source <(managoat completion zsh)")
			fmt.Fprintln(w, "_managoat() {")
			fmt.Fprintln(w, "  local -a cmds")
			fmt.Fprintf(w, "  cmds=(%s)\n", strings.Join(names, " "))
			fmt.Fprintln(w, "  if (( CURRENT == 2 )); then compadd -a cmds; return; fi")
			fmt.Fprintln(w, "  case ${words[2]} in")
			for _, n := range names {
				if takesName[n] {
					fmt.Fprintf(w, "    %s) compadd -- %s %s${(f)\"$(${words[1]} ls -q 2>/dev/null)\"}; _files ;;\n", n, strings.Join(flagsOf[n], " "), subcommandsOf(n))
					continue
				}
				fmt.Fprintf(w, "    %s) compadd -- %s; _files ;;\n", n, strings.Join(flagsOf[n], " "))
			}
			fmt.Fprintln(w, "  esac")
			fmt.Fprintln(w, "}")
			fmt.Fprintln(w, "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _managoat \"$@\"; else compdef _managoat managoat; fi")
		case "fish":
			fmt.Fprintln(w, "# fish completion for managoat: managoat completion fish | source")
			fmt.Fprintln(w, "complete -c managoat -f")
			for _, c := range commands {
				fmt.Fprintf(w, "complete -c managoat -n __fish_use_subcommand -a %s -d %q\n", c.name, c.summary)
				if takesName[c.name] {
					fmt.Fprintf(w, "complete -c managoat -n '__fish_seen_subcommand_from %s' -a '%s(managoat ls -q 2>/dev/null)'\n", c.name, subcommandsOf(c.name))
				}
				for _, f := range flagsOf[c.name] {
					opt := "-l " + strings.TrimPrefix(f, "--")
					if !strings.HasPrefix(f, "--") {
						opt = "-s " + strings.TrimPrefix(f, "-")
					}
					fmt.Fprintf(w, "complete -c managoat -n '__fish_seen_subcommand_from %s' %s\n", c.name, opt)
				}
			}
		default:
			return usageError{msg: fmt.Sprintf("unknown shell %q: bash, zsh or fish", pos[0])}
		}
		return nil
	}
}
