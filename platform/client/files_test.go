package client_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// procStatus is a field of /proc/self/status, in bytes.
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// resetPeak makes VmHWM the current RSS (clear_refs 5).
func resetPeak(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("resetting the RSS peak: %v", err)
	}
}

// TestFilesStreamThroughTheAPI: three concurrent reads of a 1000 MB
// sparse file through serve (provider/local), and a 300 MiB write, keep
// the process (client, API and provider together) within 200 MiB of RSS
// growth: each streams through a bounded buffer (fails on the old code:
// the provider's ReadFile grew a buffer to the file's size, the API
// wrote a []byte, the client read it all: 3 GB). An account's transfers
// past FileTransfersPerAccount are 429 rate_limited{file_transfers} with
// Retry-After while another account's go on; a write over MaxFile is
// too_large and leaves no file.
func TestFilesStreamThroughTheAPI(t *testing.T) {
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}, Configure: func(c *api.Config) {
		c.FileTransfersPerAccount = 3
		c.MaxFile = 400 << 20
	}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "local")
	ctx := context.Background()
	h, err := c.Create(ctx, "big", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var home string
	for _, n := range mustNames(t, p) {
		home = p.HostPath(sandbox.BuildHandle(local.Name, n), "/home/sprite")
	}
	f, err := os.Create(filepath.Join(home, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 1000 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()

	resetPeak(t)
	base := procStatus(t, "VmRSS")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			rc, sz, err := c.OpenFile(ctx, h, "/home/sprite/sparse")
			if err != nil {
				errs[i] = err
				return
			}
			defer rc.Close()
			n, err := io.Copy(io.Discard, rc)
			if err == nil && (n != size || sz != size) {
				err = errors.New("read " + strconv.FormatInt(n, 10) + " of " + strconv.FormatInt(sz, 10))
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WriteFileFrom(ctx, h, "/home/sprite/written", io.LimitReader(zeroReader{}, 300<<20), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	growth := procStatus(t, "VmHWM") - base
	t.Logf("RSS peak growth over 3 GB read and 300 MiB written: %d MiB", growth>>20)
	if growth > 200<<20 {
		t.Errorf("RSS grew by %d MiB, want < 200 MiB", growth>>20)
	}
	if st, err := os.Stat(filepath.Join(home, "written")); err != nil || st.Size() != 300<<20 {
		t.Errorf("written: %v %v", st, err)
	}

	// Over MaxFile: too large, and no file.
	err = c.WriteFileFrom(ctx, h, "/home/sprite/huge", io.LimitReader(zeroReader{}, 401<<20), sandbox.WriteFileOptions{})
	var ie *sandbox.InvalidError
	if err == nil || !errors.As(err, &ie) && !strings.Contains(err.Error(), "too") {
		t.Errorf("a write over MaxFile: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "huge")); err == nil {
		t.Error("a write over MaxFile left a file")
	}

	// Three open reads take the account's transfers: a fourth is 429.
	var open []io.Closer
	for range 3 {
		rc, _, err := c.OpenFile(ctx, h, "/home/sprite/sparse")
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, rc)
	}
	_, _, err = c.OpenFile(ctx, h, "/home/sprite/sparse")
	var rl *sandbox.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter <= 0 {
		t.Errorf("a fourth transfer: %v, want rate_limited with a Retry-After", err)
	}
	if err := c.WriteFile(ctx, h, "/home/sprite/small", []byte("x"), sandbox.WriteFileOptions{}); !errors.As(err, &rl) {
		t.Errorf("a write past the bound: %v, want rate_limited", err)
	}
	// Another account is not affected.
	bob := newClient(t, pl.URL, pl.Account(t, "bob"), "local")
	hb, err := bob.Create(ctx, "bobs", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bob.WriteFile(ctx, hb, "/home/sprite/f", []byte("bob"), sandbox.WriteFileOptions{}); err != nil {
		t.Errorf("another account's write: %v", err)
	}
	// A transfer that ends frees its place (once its handler has seen
	// the client go).
	open[0].Close()
	open = open[1:]
	acct, err := pl.Store.AccountByName(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; pl.API.FileTransfers(acct.ID) >= 3; i++ {
		if i > 5000 {
			t.Fatal("a closed read kept its place")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.WriteFile(ctx, h, "/home/sprite/small", []byte("x"), sandbox.WriteFileOptions{}); err != nil {
		t.Errorf("a write after one ended: %v", err)
	}
	for _, rc := range open {
		rc.Close()
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }

func mustNames(t *testing.T, p *local.Provider) []string {
	t.Helper()
	names, err := p.ListAllNames(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return names
}
