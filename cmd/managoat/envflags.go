package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// envFlags collects -e/--env, --env-file, -w/--dir and -u/--user, as
// docker run and exec take them. The env file's format is docker's (one
// KEY=VALUE a line, taken as is with no quoting, # comments and blank lines
// skipped, a bare KEY passing managoat's own value): a dotenv library
// would unquote and expand, which docker does not, so it is read here.
type envFlags struct {
	env, files multiFlag
	dir, user  string
}

func (f *envFlags) add(fs *flag.FlagSet) {
	fs.Var(&f.env, "e", "set an environment variable: `KEY=VALUE`, or KEY for managoat's own value (repeatable)")
	fs.Var(&f.env, "env", "the same as -e")
	fs.Var(&f.files, "env-file", "read environment variables from `FILE`, one KEY=VALUE a line (repeatable)")
	fs.StringVar(&f.dir, "w", "", "working directory `DIR` inside the sandbox")
	fs.StringVar(&f.dir, "dir", "", "the same as -w")
	fs.StringVar(&f.user, "u", "", "run as `USER`: only the sandbox's own user (sprite, uid 1000, on the jail), the one a command runs as")
	fs.StringVar(&f.user, "user", "", "the same as -u")
}

// environ is the KEY=VALUE list the flags give: the env files' first, in
// order, then -e's, so that -e overrides a file.
func (f *envFlags) environ() ([]string, error) {
	var out []string
	for _, name := range f.files {
		file, err := os.Open(name)
		if err != nil {
			return nil, usageError{msg: "--env-file: " + err.Error(), bare: true}
		}
		s := bufio.NewScanner(file)
		for n := 1; s.Scan(); n++ {
			line := strings.TrimSpace(s.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			kv, ok, err := envEntry(line)
			if err != nil {
				file.Close()
				return nil, usageError{msg: fmt.Sprintf("--env-file %s:%d: %v", name, n, err), bare: true}
			}
			if ok {
				out = append(out, kv)
			}
		}
		err = s.Err()
		file.Close()
		if err != nil {
			return nil, usageError{msg: "--env-file: " + err.Error(), bare: true}
		}
	}
	for _, e := range f.env {
		kv, ok, err := envEntry(e)
		if err != nil {
			return nil, usageError{msg: "-e: " + err.Error()}
		}
		if ok {
			out = append(out, kv)
		}
	}
	return out, nil
}

// envEntry is e as KEY=VALUE; a bare KEY takes managoat's own value, and
// is left out (ok false) when managoat has none, as docker does.
func envEntry(e string) (kv string, ok bool, err error) {
	k, _, hasValue := strings.Cut(e, "=")
	if k == "" || strings.ContainsAny(k, " \t") {
		return "", false, fmt.Errorf("%q is not KEY=VALUE", e)
	}
	if hasValue {
		return e, true, nil
	}
	v, set := os.LookupEnv(k)
	if !set {
		return "", false, nil
	}
	return k + "=" + v, true, nil
}

// sandboxUsers are the names of the one user a local sandbox's commands
// run as (mechanism.Home's owner).
var sandboxUsers = map[string]bool{"sprite": true, "1000": true, "1000:1000": true}

// checkUser refuses a -u the provider cannot honour: no provider of this
// build lets a command choose its user, so -u is accepted only when it
// names the user commands run as anyway (sprite in a jail or OCI sandbox),
// and refused, never dropped, otherwise.
func (f *envFlags) checkUser(g *globals) error {
	if f.user == "" {
		return nil
	}
	if g.provider == "local" && g.mechanism != "trusted" && sandboxUsers[f.user] {
		return nil
	}
	return &sandbox.InvalidError{Reason: "user", Msg: fmt.Sprintf(
		"-u %s: provider %s (mechanism %s) runs every command as its sandbox's one user (sprite, uid 1000, on the jail and OCI; the caller's on trusted) and cannot switch to another",
		f.user, g.provider, g.mechanism)}
}
