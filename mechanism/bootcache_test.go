package mechanism_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/managoat/managoat/mechanism"
)

// countingProber says available for every name in ok, and counts probes.
type countingProber struct {
	mu     sync.Mutex
	ok     map[mechanism.Capability]bool
	probes int
}

func (c *countingProber) Probe(_ context.Context, name mechanism.Capability) mechanism.Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probes++
	if c.ok[name] {
		return mechanism.Report{Name: name, Available: true, Detail: "seen " + string(name)}
	}
	return mechanism.Report{Name: name, Detail: "no " + string(name)}
}

func (c *countingProber) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.probes }

func TestBootCache(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "probes.json")
	under := &countingProber{ok: map[mechanism.Capability]bool{mechanism.Landlock: true}}
	first := &mechanism.BootCache{Path: path, P: under}
	if r := first.Probe(ctx, mechanism.Landlock); !r.Available || r.Detail != "seen landlock" {
		t.Fatalf("first probe = %+v", r)
	}
	if r := first.Probe(ctx, mechanism.MemoryCap); r.Available {
		t.Fatalf("memory_cap = %+v", r)
	}

	// A later process (a new BootCache on the same file) trusts what was
	// available and probes again what was not.
	second := &mechanism.BootCache{Path: path, P: under}
	before := under.count()
	if r := second.Probe(ctx, mechanism.Landlock); !r.Available || r.Detail != "seen landlock" {
		t.Fatalf("cached probe = %+v", r)
	}
	if under.count() != before {
		t.Fatal("an available verdict from this boot was probed again")
	}
	second.Probe(ctx, mechanism.MemoryCap)
	if under.count() != before+1 {
		t.Fatal("an unavailable verdict was not probed again")
	}

	// Forget removes the file: the next process probes for real.
	second.Forget()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("cache file after Forget: %v", err)
	}
	third := &mechanism.BootCache{Path: path, P: under}
	before = under.count()
	third.Probe(ctx, mechanism.Landlock)
	if under.count() != before+1 {
		t.Fatal("Forget did not make the next process probe")
	}
}

func TestBootCacheIgnoresForeignFiles(t *testing.T) {
	ctx := context.Background()
	under := &countingProber{ok: map[mechanism.Capability]bool{mechanism.Landlock: true}}
	for name, content := range map[string]string{
		"corrupt":       `{"key":`,
		"another boot":  `{"entries":[{"key":"v1 boot=0000 kernel=x","available":{"landlock":"forged"}}]}`,
		"older format":  `{"key":"v1 boot=0000 kernel=x","available":{"landlock":"forged"}}`,
		"unknown shape": `[1,2,3]`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "probes.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			before := under.count()
			r := (&mechanism.BootCache{Path: path, P: under}).Probe(ctx, mechanism.Landlock)
			if under.count() != before+1 || r.Detail == "forged" {
				t.Fatalf("a %s file was trusted: %+v", name, r)
			}
		})
	}
	// A directory others can write is never trusted (nor written).
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "probes.json")
	(&mechanism.BootCache{Path: path, P: under}).Probe(ctx, mechanism.Landlock)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("cache written in a world-writable directory: %v", err)
	}
}

// The verdicts of another binary (another key) in the file are kept when
// this one writes its own, and never served to it.
func TestBootCacheKeepsOtherKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "probes.json")
	other := `{"entries":[{"key":"v1 boot=0000 kernel=x exe=/other","available":{"landlock":"the other binary's"}}]}`
	if err := os.WriteFile(path, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	under := &countingProber{ok: map[mechanism.Capability]bool{mechanism.Landlock: true}}
	if r := (&mechanism.BootCache{Path: path, P: under}).Probe(ctx, mechanism.Landlock); r.Detail != "seen landlock" || under.count() != 1 {
		t.Fatalf("probe = %+v after %d probes", r, under.count())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Entries []struct {
			Key       string            `json:"key"`
			Available map[string]string `json:"available"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(b, &f); err != nil || len(f.Entries) != 2 {
		t.Fatalf("file %s: %v", b, err)
	}
	if f.Entries[0].Key != mechanism.BootKey() || f.Entries[1].Available["landlock"] != "the other binary's" {
		t.Fatalf("entries: %+v", f.Entries)
	}
	// A later process of this binary reads its own entry.
	if r := (&mechanism.BootCache{Path: path, P: under}).Probe(ctx, mechanism.Landlock); r.Detail != "seen landlock" || under.count() != 1 {
		t.Fatalf("second probe = %+v after %d probes", r, under.count())
	}
}

// A CachingProber over a BootCache forgets both.
func TestCachingProberForget(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "probes.json")
	under := &countingProber{ok: map[mechanism.Capability]bool{mechanism.Landlock: true}}
	p := &mechanism.CachingProber{P: &mechanism.BootCache{Path: path, P: under}}
	p.Probe(ctx, mechanism.Landlock)
	p.Probe(ctx, mechanism.Landlock)
	if under.count() != 1 {
		t.Fatalf("%d probes, want 1", under.count())
	}
	mechanism.ForgetProbes(p)
	p.Probe(ctx, mechanism.Landlock)
	if under.count() != 2 {
		t.Fatalf("after ForgetProbes: %d probes, want 2", under.count())
	}
}
