package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
)

func init() {
	register("completion", "bash|zsh|fish", "Print a shell completion script (e.g. source <(managoat completion bash))", cmdCompletion)
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
