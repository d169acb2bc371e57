// Command forgothook is a program that uses the local provider and calls
// none of the hooks (no jail.Init, no local.MaybeRunSupervisor): see
// TestForgottenHooks. Every start of its main appends a line to
// STATE/starts, so the test counts how often main ran.
//
//	FORGOT_STATE=dir FORGOT_MODE=builtin forgothook   jail by name: Create, Exec echo, Destroy
//	FORGOT_STATE=dir FORGOT_MODE=custom forgothook    its own Config.Mechanism (trusted)
//
// (The settings are in the environment, which a re-executed process
// inherits, not in arguments, which it does not: a main run again in a
// supervisor gets as far as a main can.)
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/managoat/managoat/mechanism/trusted"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func main() {
	state, mode := os.Getenv("FORGOT_STATE"), os.Getenv("FORGOT_MODE")
	f, err := os.OpenFile(filepath.Join(state, "starts"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	fmt.Fprintln(f, os.Getpid())
	f.Close()
	cfg := local.Config{StateDir: state, MechanismName: "jail"}
	if mode == "custom" {
		m, err := trusted.New(filepath.Join(state, "mech", "trusted"))
		if err != nil {
			panic(err)
		}
		cfg = local.Config{StateDir: state, Mechanism: m}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := local.New(cfg)
	if err != nil {
		fmt.Println("new:", err)
		os.Exit(1)
	}
	h, err := p.Create(ctx, "box", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println("create:", err)
		os.Exit(1)
	}
	defer p.Destroy(ctx, h)
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"hello"}}, sandbox.ExecOptions{})
	if err != nil {
		fmt.Println("exec:", err)
		os.Exit(1)
	}
	fmt.Printf("exec: %d %s", res.ExitCode, res.Output)
}
