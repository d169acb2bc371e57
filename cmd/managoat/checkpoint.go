package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("checkpoint", "create|ls|restore [flags] NAME [ID]", "Snapshot a sandbox's disk (create), list its snapshots (ls), or roll it back to one (restore)", cmdCheckpoint)
}

// checkpointLister is a provider that lists a sandbox's checkpoints
// (provider/local); the contract has no listing.
type checkpointLister interface {
	Checkpoints(ctx context.Context, h *sandbox.Handle) ([]string, error)
}

func cmdCheckpoint(g *globals, fs *flag.FlagSet) action {
	comment := fs.String("comment", "", "create: a note kept with the checkpoint")
	var of outputFlags
	of.add(fs, false)
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 3)
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		if len(pos) == 0 {
			return usageError{msg: "missing create, ls or restore"}
		}
		want := map[string]int{"create": 2, "ls": 2, "restore": 3}[pos[0]]
		switch {
		case want == 0:
			return usageError{msg: fmt.Sprintf("unknown checkpoint command %q: create, ls or restore", pos[0])}
		case len(pos) < want && want == 3:
			return usageError{msg: "missing NAME and ID"}
		case len(pos) < want:
			return usageError{msg: "missing NAME"}
		case len(pos) > want:
			return usageError{msg: fmt.Sprintf("unexpected argument %q", pos[want])}
		}
		reg, h, err := handleFor(g, pos[1])
		if err != nil {
			return err
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		caps, err := reg.CapabilitiesOf(ctx, h)
		if err != nil {
			return wrap("checkpoint", err)
		}
		if !caps.Has(sandbox.CapCheckpoint) {
			return fmt.Errorf("provider %s does not advertise checkpoints: %w", g.provider, sandbox.ErrNotSupported)
		}
		switch pos[0] {
		case "create":
			id, err := reg.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{Comment: *comment})
			if err != nil {
				return wrap("create", err)
			}
			if of.json() {
				return json.NewEncoder(os.Stdout).Encode(map[string]string{"id": id, "sandbox": h.Name})
			}
			fmt.Println(id)
		case "ls":
			p, err := reg.Provider(h.Provider)
			if err != nil {
				return err
			}
			cl, ok := p.(checkpointLister)
			if !ok {
				return fmt.Errorf("ls: provider %s cannot list checkpoints (create prints each id): %w", g.provider, sandbox.ErrNotSupported)
			}
			ids, err := cl.Checkpoints(ctx, h)
			if err != nil {
				return wrap("ls", err)
			}
			if of.json() {
				type row struct {
					ID string `json:"id"`
				}
				rows := make([]row, 0, len(ids))
				for _, id := range ids {
					rows = append(rows, row{id})
				}
				return json.NewEncoder(os.Stdout).Encode(rows)
			}
			fmt.Println("CHECKPOINT")
			for _, id := range ids {
				fmt.Println(id)
			}
		case "restore":
			err := reg.RestoreCheckpoint(ctx, h, pos[2])
			if errors.Is(err, sandbox.ErrNotFound) {
				return fmt.Errorf("restore: checkpoint %q of sandbox %q: %w", pos[2], h.Name, err)
			}
			return wrap("restore", err)
		}
		return nil
	}
}
