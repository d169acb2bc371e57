package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// quotaProvider is a jail provider whose host bounds homes.
func quotaProvider(t *testing.T) *Provider {
	t.Helper()
	p := newJail(t)
	method, why := DiskQuotaMethod(p.Mechanism())
	testenv.Require(t, method != "", "a home quota on this host: "+why)
	return p
}

// rawOf is a sandbox's Get raw info.
func rawOf(t *testing.T, p *Provider, h *sandbox.Handle) map[string]any {
	t.Helper()
	info, err := p.Get(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(info.Raw, &raw); err != nil {
		t.Fatal(err)
	}
	return raw
}

// leftovers lists what a quota may leave of the sandboxes below state: a
// mount point, a loop device backed by a file there, an image.
func leftovers(t *testing.T, state string) []string {
	t.Helper()
	var out []string
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], state+"/") {
			out = append(out, "mount "+f[4])
		}
	}
	ls, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range ls {
		if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(string(b), state+"/") {
			out = append(out, "loop "+l+": "+strings.TrimSpace(string(b)))
		}
	}
	_ = filepath.WalkDir(state, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "home.img" {
			out = append(out, "image "+p)
		}
		return nil
	})
	return out
}

func execOut(t *testing.T, p *Provider, h *sandbox.Handle, script string) (string, int) {
	t.Helper()
	r, err := p.Exec(context.Background(), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.ExecOptions{})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return string(r.Output), r.ExitCode
}

// A sandbox made without a quota gets the default where the host bounds
// homes cheaply (project quotas), or where the operator asked for it
// ($MANAGOAT_DEFAULT_DISK); ls's raw info says the limit and the use.
func TestDiskQuotaDefault(t *testing.T) {
	p := quotaProvider(t)
	method, _ := DiskQuotaMethod(p.Mechanism())
	n, how := p.DefaultDiskQuota()
	switch {
	case method == "project" && (n <= 0 || n > DefaultDiskBytes() || how != "project"):
		t.Fatalf("with project quotas: default %d, %q", n, how)
	case method == "loop" && (n != 0 || !strings.Contains(how, "not by default")):
		t.Fatalf("with a loop device, unasked: default %d, %q", n, how)
	}
	t.Setenv(EnvDefaultDisk, "64M")
	p, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	if n, how := p.DefaultDiskQuota(); n != 64<<20 || how != method {
		t.Fatalf("asked for 64M: default %d, %q", n, how)
	}
	ctx := context.Background()
	h, err := p.Create(ctx, "dflt", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawOf(t, p, h)
	lim, _ := raw["limits"].(map[string]any)
	if got, _ := lim["disk_bytes"].(float64); int64(got) != 64<<20 {
		t.Fatalf("raw limits %v, want disk_bytes %d", raw["limits"], 64<<20)
	}
	if _, ok := raw["disk_used_bytes"].(float64); !ok && method == "loop" {
		t.Fatalf("no disk_used_bytes in %v", raw)
	}
	out, _ := execOut(t, p, h, "df -B1 --output=size $HOME | tail -1")
	var size int64
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &size); err != nil || size > 64<<20 || size < 48<<20 {
		t.Fatalf("the home's size inside: %q (%v), want about 64 MiB", out, err)
	}
	// Off with a zero Limits, as for the other defaults.
	q, err := New(Config{StateDir: t.TempDir(), DefaultLimits: &sandbox.Limits{}})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := q.DefaultDiskQuota(); n != 0 {
		t.Fatalf("defaults off, disk %d", n)
	}
}

func TestDefaultDiskBytesEnv(t *testing.T) {
	for v, want := range map[string]int64{"": 10 << 30, "0": 0, "512M": 512 << 20, "2G": 2 << 30, "junk": 0} {
		t.Setenv(EnvDefaultDisk, v)
		if got := DefaultDiskBytes(); got != want {
			t.Errorf("%s=%q: %d, want %d", EnvDefaultDisk, v, got, want)
		}
	}
}

// One sandbox fills its home: the write fails inside, that sandbox goes
// on, another sandbox's session is untouched, and Destroy leaves no
// mount, loop device or image.
func TestDiskQuotaFullHome(t *testing.T) {
	p := quotaProvider(t)
	ctx := context.Background()
	a, err := p.Create(ctx, "full", sandbox.CreateOptions{Limits: sandbox.Limits{DiskBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Create(ctx, "other", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Spawn(ctx, b, sandbox.Cmd{Name: "sh", Args: []string{"-c", "read x; for i in 1 2 3 4 5; do echo B $i; done; echo $x > $HOME/b; cat $HOME/b"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	out, code := execOut(t, p, a, "dd if=/dev/zero of=$HOME/fill bs=1M count=64 2>&1")
	if code == 0 || !strings.Contains(out, "No space left") {
		t.Fatalf("a 64 MiB write under a 16 MiB quota: exit %d: %s", code, out)
	}
	raw := rawOf(t, p, a)
	if used, _ := raw["disk_used_bytes"].(float64); used < 8<<20 || used > 16<<20 {
		t.Fatalf("disk_used_bytes %v after the fill", raw["disk_used_bytes"])
	}
	if out, code := execOut(t, p, a, "echo still here"); code != 0 || out != "still here\n" {
		t.Fatalf("after the fill: %d %q", code, out)
	}
	if err := c.WriteStdin(ctx, []byte("written\n")); err != nil {
		t.Fatal(err)
	}
	var got string
	var exit sandbox.Event
	for ev := range c.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			got += string(ev.Data)
		case sandbox.Exit, sandbox.Error:
			exit = ev
		}
	}
	if exit.Kind != sandbox.Exit || exit.Code != 0 || got != "B 1\nB 2\nB 3\nB 4\nB 5\nwritten\n" {
		t.Fatalf("the other sandbox's session: %+v %q", exit, got)
	}
	for _, h := range []*sandbox.Handle{a, b} {
		if err := p.Destroy(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if l := leftovers(t, p.StateDir()); len(l) > 0 {
		t.Fatalf("after Destroy: %v", l)
	}
}

// The supervisor killed with SIGKILL: the next call adopts the sandbox
// again, its home still mounted and bounded; Destroy then leaves nothing.
func TestDiskQuotaSupervisorKilled(t *testing.T) {
	p := quotaProvider(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "k9q", sandbox.CreateOptions{Limits: sandbox.Limits{DiskBytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	execOut(t, p, h, "echo kept > $HOME/k")
	pid, err := supervisorPid(ctx, p, h)
	if err != nil {
		t.Fatal(err)
	}
	syscallKill(pid)
	waitFor(t, func() bool { return syscall.Kill(pid, 0) != nil })
	if raw := rawOf(t, p, h); raw["readopted"] != true {
		t.Fatalf("Get after kill -9 of the supervisor: %v", raw)
	}
	out, code := execOut(t, p, h, "cat $HOME/k; dd if=/dev/zero of=$HOME/f bs=1M count=32 2>&1 | grep -o 'No space left'")
	if code != 0 || out != "kept\nNo space left\n" {
		t.Fatalf("after the adoption: %d %q", code, out)
	}
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, p.StateDir()); len(l) > 0 {
		t.Fatalf("after Destroy: %v", l)
	}
}

// Where no quota can be enforced a create asking for one is refused, and
// none is applied by default.
func TestDiskQuotaRefusedByTrusted(t *testing.T) {
	p := newTrusted(t)
	if n, why := p.DefaultDiskQuota(); n != 0 || why == "" {
		t.Fatalf("trusted got a default home quota: %d (%s)", n, why)
	}
	if m, why := DiskQuotaMethod(p.Mechanism()); m != "" || why == "" {
		t.Fatalf("DiskQuotaMethod(trusted) = %q, %q", m, why)
	}
	_, err := p.Create(context.Background(), "tq", sandbox.CreateOptions{Limits: sandbox.Limits{DiskBytes: 16 << 20}})
	var inv *sandbox.InvalidError
	if !errors.As(err, &inv) || !strings.Contains(err.Error(), "disk_quota") {
		t.Fatalf("--disk on trusted: %v, want Invalid naming disk_quota", err)
	}
}
