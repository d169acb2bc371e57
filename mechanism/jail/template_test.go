package jail

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/hostfacts"
)

// requireTemplates requires root, and skips where the kernel has no
// procfs pidns option (hostfacts.ProcPidns, a fact of the kernel's version,
// not a prerequisite): the template serves only inits born restricted,
// and without the option every jail test runs the other start.
func requireTemplates(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	if f := hostfacts.Get(hostfacts.ProcPidns); !f.Present {
		t.Skipf("tree templates serve only inits born restricted, which need the procfs pidns option (Linux 6.18): %s", f.Detail)
	}
}

// pinDir requires what requireTemplates does and returns a TemplateDir
// whose pins are undone when t ends; then, when set, after checks dir.
func pinDir(t *testing.T, after func(dir string)) string {
	t.Helper()
	requireTemplates(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		if err := UnpinTemplates(dir); err != nil {
			t.Error(err)
		}
		if after != nil {
			after(dir)
		}
	})
	return dir
}

// templateJail returns a Jail on a kernel where the template serves, and
// a function that provisions and starts a sandbox in it.
func templateJail(t *testing.T) (*Jail, func(id string)) {
	t.Helper()
	requireTemplates(t)
	j, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return j, func(id string) {
		t.Helper()
		startIn(t, j, id)
	}
}

// startIn provisions and starts sandbox id in j, destroyed at the test's
// end.
func startIn(t *testing.T, j *Jail, id string) {
	t.Helper()
	ctx := context.Background()
	if err := j.Provision(ctx, id, mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), id) })
	if err := j.Start(ctx, id); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
}

// nsMountinfo is the mount table of the mount namespace ns, read from
// outside through a thread in it (there is no /proc inside); "" when the
// namespace cannot be joined.
func nsMountinfo(ns int) string {
	tid, done := make(chan int), make(chan struct{})
	go onDiscardedThread(func() {
		if unix.Unshare(unix.CLONE_FS) != nil || unix.Setns(ns, unix.CLONE_NEWNS) != nil {
			tid <- 0
			return
		}
		tid <- unix.Gettid()
		<-done
	})
	id := <-tid
	defer close(done)
	if id == 0 {
		return ""
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(id) + "/mountinfo")
	return string(b)
}

// waitTemplate polls until j's tree template is ready.
func waitTemplate(t *testing.T, j *Jail) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if j.tmpl.ready() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the tree template was never built")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sh(t *testing.T, j *Jail, id, script string) string {
	t.Helper()
	c, err := j.Execute(context.Background(), id, []string{"sh", "-c", script}, mechanism.ExecOptions{})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return strings.TrimSpace(string(c.Stdout) + string(c.Stderr))
}

// Sandboxes started from the tree template are each their own: their
// hostname in /etc, their home, a read-only root, /etc and /dev shared
// with no way to change them, and the same tree as one built from
// scratch.
func TestTreeTemplate(t *testing.T) {
	j, start := templateJail(t)
	for _, id := range []string{"first", "second", "third", "fourth"} {
		start(id)
		if id == "second" {
			waitTemplate(t, j) // two were built; the others are clones
		}
	}
	// The same mounts as the tree built from scratch, plus the sandbox's
	// own /etc/hosts and /etc/hostname.
	mounts := func(id string) string {
		return sh(t, j, id, "awk '{print $5, $6}' /proc/self/mountinfo | sed 's/,relatime//' | sort")
	}
	cloned := mounts("third")
	for _, own := range []string{"/etc/hosts ro,nosuid,nodev,noexec\n", "/etc/hostname ro,nosuid,nodev,noexec\n"} {
		if !strings.Contains(cloned, own) {
			t.Fatalf("a cloned tree lacks its own %q:\n%s", own, cloned)
		}
		cloned = strings.Replace(cloned, own, "", 1)
	}
	if a, b := mounts("first"), cloned; a != b {
		t.Fatalf("a cloned tree differs from a built one:\nbuilt:\n%s\ncloned:\n%s", a, b)
	}
	for _, id := range []string{"third", "fourth"} {
		if got := sh(t, j, id, "hostname; cat /etc/hostname; grep -c \" $(hostname)$\" /etc/hosts"); got != id+"\n"+id+"\n1" {
			t.Fatalf("%s names itself %q", id, got)
		}
		if got := sh(t, j, id, "echo mine > ~/f; cat ~/f"); got != "mine" {
			t.Fatalf("%s home: %q", id, got)
		}
		for _, path := range []string{"/x", "/etc/x", "/etc/passwd", "/etc/hosts", "/dev/x", "/run/x", "/usr/x"} {
			if got := sh(t, j, id, "(echo no > "+path+") 2>/dev/null && echo WROTE || echo refused"); got != "refused" {
				t.Fatalf("%s: writing %s: %s", id, path, got)
			}
		}
	}
	if got := sh(t, j, "fourth", "cat ~/f 2>/dev/null || echo none"); got != "mine" {
		t.Fatalf("fourth's home: %q", got)
	}
	if got := sh(t, j, "first", "ls /home/sprite"); got != "" {
		t.Fatalf("first sees %q in its home: another sandbox's file", got)
	}
}

// A template that cannot be cloned is dropped and built again; the start
// meanwhile builds its tree itself. Its namespace holds none of the
// host's other mounts.
func TestTreeTemplateBroken(t *testing.T) {
	j, start := templateJail(t)
	start("a")
	start("a2")
	waitTemplate(t, j)
	ns, troot, _ := j.tmpl.get()
	defer unix.Close(ns)
	unix.Close(troot)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	tmplMounts := nsMountinfo(ns)
	if len(tmplMounts) == 0 {
		t.Fatal("cannot read the template's mounts")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == "/sys/fs/cgroup" && strings.Contains(tmplMounts, " /sys/fs/cgroup ") {
			t.Fatalf("the template's namespace still holds the host's mounts:\n%s", tmplMounts)
		}
	}
	// Break it: a root descriptor from outside its namespace.
	host, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	j.tmpl.mu.Lock()
	unix.Close(j.tmpl.root)
	j.tmpl.root = host
	j.tmpl.mu.Unlock()
	start("b")
	if got := sh(t, j, "b", "hostname; ls /usr/bin/sh; ls /run | wc -l"); got != "b\n/usr/bin/sh\n0" {
		t.Fatalf("b after a broken template: %q", got)
	}
	waitTemplate(t, j) // rebuilt, and it serves
	start("c")
	if got := sh(t, j, "c", "hostname; cat /etc/hostname; ls /usr/bin/sh"); got != "c\nc\n/usr/bin/sh" {
		t.Fatalf("c from the rebuilt template: %q", got)
	}
}

// A template whose host sources were replaced since (a new ld.so.cache
// renamed over the old, say) is not cloned: the start builds its tree and
// the template is built again from the host as it is now.
func TestTreeTemplateStale(t *testing.T) {
	j, start := templateJail(t)
	start("a")
	start("b")
	waitTemplate(t, j)
	if !j.tmpl.fresh() {
		t.Fatal("a template just built is stale")
	}
	j.tmpl.mu.Lock()
	j.tmpl.sources["/etc/ld.so.cache"] = fileID{1, 1} // "replaced on the host"
	j.tmpl.mu.Unlock()
	if j.tmpl.fresh() {
		t.Fatal("a replaced source went unnoticed")
	}
	start("c") // builds its own tree; the next start rebuilds the template
	if got := sh(t, j, "c", "hostname; ls /usr/bin/sh"); got != "c\n/usr/bin/sh" {
		t.Fatalf("c: %q", got)
	}
	waitTemplate(t, j)
	if !j.tmpl.fresh() {
		t.Fatal("the rebuilt template is stale")
	}
}

// A template pinned in a TemplateDir serves the first start of every
// later process (here: later Jails, which share nothing in memory): it
// is adopted, its clones are whole sandboxes, and a pin whose host
// sources changed is replaced, never adopted.
func TestPinnedTemplate(t *testing.T) {
	dir := pinDir(t, nil)
	state := t.TempDir()
	newJail := func() *Jail {
		j, err := New(Config{StateDir: state, TemplateDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	start := func(j *Jail, id string) {
		t.Helper()
		startIn(t, j, id)
		if got := sh(t, j, id, "hostname; cat /etc/hostname; ls /usr/bin/sh; touch /etc/x 2>/dev/null || echo ro"); got != id+"\n"+id+"\n/usr/bin/sh\nro" {
			t.Fatalf("sandbox %s: %q", id, got)
		}
	}
	// This binary's index (the only one until the end).
	indexPath := func() string {
		t.Helper()
		m, _ := filepath.Glob(dir + "/template-*.json")
		if len(m) != 1 {
			t.Fatalf("index files: %v", m)
		}
		return m[0]
	}
	index := func() pinIndexFile {
		t.Helper()
		var idx pinIndexFile
		b, err := os.ReadFile(indexPath())
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			t.Fatal(err)
		}
		return idx
	}

	first := newJail()
	start(first, "p1")
	if !first.tmpl.ready() || first.tmpl.adopted || first.tmpl.pinErr != nil {
		t.Fatalf("first start: ready %v adopted %v pin error %v", first.tmpl.ready(), first.tmpl.adopted, first.tmpl.pinErr)
	}
	pinned := index()

	second := newJail()
	start(second, "p2")
	if !second.tmpl.adopted {
		t.Fatal("a second process's first start did not adopt the pinned template")
	}
	if got := index(); got.Pin != pinned.Pin {
		t.Fatalf("adopting replaced the pin: %s -> %s", pinned.Pin, got.Pin)
	}

	// The host's sources as the pin records them changed: a new one.
	stale := pinned
	for p, id := range stale.Sources {
		stale.Sources[p] = [2]uint64{id[0], id[1] + 1}
	}
	b, _ := json.Marshal(stale)
	if err := os.WriteFile(indexPath(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	third := newJail()
	start(third, "p3")
	if third.tmpl.adopted || third.tmpl.pinErr != nil {
		t.Fatalf("a stale pin: adopted %v, pin error %v", third.tmpl.adopted, third.tmpl.pinErr)
	}
	if got := index(); got.Pin == pinned.Pin {
		t.Fatal("the stale pin was not replaced")
	}
	if _, err := os.Stat(dir + "/" + pinned.Pin); !os.IsNotExist(err) {
		t.Fatalf("the replaced pin is still there: %v", err)
	}
	// A sandbox started from the first pin works on without it.
	if got := sh(t, second, "p2", "ls /usr/bin/sh"); got != "/usr/bin/sh" {
		t.Fatalf("p2 after its template was unpinned: %q", got)
	}

	// A key from another binary or boot is never adopted.
	other := index()
	other.Key = "another binary"
	b, _ = json.Marshal(other)
	if err := os.WriteFile(indexPath(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	fourth := newJail()
	start(fourth, "p4")
	if fourth.tmpl.adopted {
		t.Fatal("a pin under another key was adopted")
	}

	// The right key, but the file pins another namespace than the one
	// the index was written for (a mistake, a leftover): not adopted.
	wrong := index()
	wrong.NS[1]++
	b, _ = json.Marshal(wrong)
	if err := os.WriteFile(indexPath(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	fifth := newJail()
	start(fifth, "p5")
	if fifth.tmpl.adopted {
		t.Fatal("a pin of another namespace than the index names was adopted")
	}

	// Other binaries' templates: one whose binary is still there is kept
	// beside this one's; one whose binary is gone is collected (its pin
	// unmounted) by the next pin.
	ns, root, ok := fifth.tmpl.get()
	if !ok {
		t.Fatal("no template")
	}
	defer unix.Close(ns)
	unix.Close(root)
	if err := fifth.tmpl.pin(ns, "another installed binary", thisExe(), fifth.tmpl.sources); err != nil {
		t.Fatal(err)
	}
	if err := fifth.tmpl.pin(ns, "a binary since deleted", exeID{Path: "/nonexistent/managoat", Size: 1}, fifth.tmpl.sources); err != nil {
		t.Fatal(err)
	}
	idx, _ := readIndex(filepath.Join(dir, indexName("a binary since deleted")))
	if idx.Pin == "" {
		t.Fatal("no index for the deleted binary's template")
	}
	sixth := newJail()
	if err := sixth.tmpl.pin(ns, "a third binary", thisExe(), fifth.tmpl.sources); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, indexName("another installed binary"))); err != nil {
		t.Fatalf("a live binary's template was collected: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, indexName("a binary since deleted"))); !os.IsNotExist(err) {
		t.Fatalf("a deleted binary's index is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, idx.Pin)); !os.IsNotExist(err) {
		t.Fatalf("a deleted binary's pin is still there: %v", err)
	}
	// At most maxPins templates, the newest kept.
	for i := range maxPins + 2 {
		if err := sixth.tmpl.pin(ns, fmt.Sprint("binary ", i), thisExe(), fifth.tmpl.sources); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := filepath.Glob(dir + "/template-*.json"); len(m) != maxPins {
		t.Fatalf("%d index files, want %d", len(m), maxPins)
	}
	if m, _ := filepath.Glob(dir + "/mnt-*"); len(m) != maxPins {
		t.Fatalf("%d pins, want %d", len(m), maxPins)
	}
	if _, err := os.Stat(filepath.Join(dir, indexName(fmt.Sprint("binary ", maxPins+1)))); err != nil {
		t.Fatalf("the newest template was collected: %v", err)
	}
}
