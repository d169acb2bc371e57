package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// TestGetSaysWhereItLives: Get's Raw is the provider's body plus the
// platform's word (provider, platform_state), and List names each
// sandbox's provider.
func TestGetSaysWhereItLives(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "fake")
	ctx := context.Background()
	h, err := c.Create(ctx, "box", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, h)
	if err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get = %+v, %v", info, err)
	}
	var raw map[string]any
	if err := json.Unmarshal(info.Raw, &raw); err != nil || raw["provider"] != "fake" || raw["platform_state"] != "running" {
		t.Fatalf("Raw = %s (%v)", info.Raw, err)
	}
	l, err := c.List(ctx)
	if err != nil || len(l) != 1 || l[0].Provider != "fake" || l[0].Name != "box" {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if _, err := c.Get(ctx, sandbox.BuildHandle("fake", "box")); err == nil {
		t.Fatal("a handle of another provider was accepted")
	}
}

// TestLargeOutputArrivesWhole: output messages larger than one event (a
// 300 KB write, then stderr, then stdout again) arrive byte for byte, in
// order, each on its own stream, and the exit after them.
func TestLargeOutputArrivesWhole(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "fake")
	ctx := context.Background()
	h, err := c.Create(ctx, "box", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var big strings.Builder
	for i := 0; big.Len() < 300_000; i++ {
		fmt.Fprintf(&big, "%07d|", i)
	}
	cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:" + big.String(), "err:middle", "out:tail", "exit:7"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var seq []string // the streams in arrival order, runs merged
	var out, errOut strings.Builder
	code := -1
	for ev := range cmd.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			out.Write(ev.Data)
		case sandbox.Stderr:
			errOut.Write(ev.Data)
		case sandbox.Exit:
			code = ev.Code
		case sandbox.Error:
			t.Fatal(ev.Err)
		}
		if k := ev.Kind.String(); len(seq) == 0 || seq[len(seq)-1] != k {
			seq = append(seq, k)
		}
	}
	if out.String() != big.String()+"tail" || errOut.String() != "middle" || code != 7 {
		t.Fatalf("stdout %d bytes (want %d), stderr %q, exit %d", out.Len(), big.Len()+4, errOut.String(), code)
	}
	if got := strings.Join(seq, ","); got != "stdout,stderr,stdout,exit" {
		t.Fatalf("events arrived as %s", got)
	}
}
