package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// A start killed after it launched the init but before it recorded the
// init's pid, cgroup and socket leaves a "starting" state and a running
// init. Stop and Destroy find what the launch made by name: the init, its
// cgroups and its socket go with the sandbox.
func TestDestroyAfterAStartCutShort(t *testing.T) {
	testenv.RequireRoot(t)
	j, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := j.Provision(ctx, "cut", mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), "cut") })
	if err := j.Start(ctx, "cut"); err != nil {
		t.Fatal(err)
	}
	dir := j.dir("cut")
	st, err := readState(dir)
	if err != nil {
		t.Fatal(err)
	}
	pid, g, sock := st.InitPid, j.group(st), st.Socket
	testenv.Require(t, g != nil, "the jail made no cgroup on this host")
	st.Status = mechanism.StatusStarting // what the cut-short start wrote last
	st.InitPid, st.InitStart, st.Cgroup, st.Socket = 0, 0, "", ""
	if err := writeState(dir, st); err != nil {
		t.Fatal(err)
	}
	if s, _ := j.Status(ctx, "cut"); s != mechanism.StatusStopped {
		t.Fatalf("status = %s", s)
	}
	if err := j.Destroy(ctx, "cut"); err != nil {
		t.Fatal(err)
	}
	gone := func(p string) bool { _, err := os.Stat(p); return errors.Is(err, os.ErrNotExist) }
	for deadline := time.Now().Add(10 * time.Second); !gone(fmt.Sprintf("/proc/%d", pid)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the init (pid %d) outlived the Destroy", pid)
		}
	}
	for _, d := range g.Dirs() {
		if !gone(d) {
			t.Errorf("cgroup %s outlived the Destroy", d)
		}
	}
	if !gone(sock) {
		t.Errorf("socket %s outlived the Destroy", sock)
	}
}

// A Destroy killed between setting the state aside and removing it leaves
// a .destroy-* directory: the orphan sweep removes it once it is old.
func TestSweepRemovesSetAsideState(t *testing.T) {
	dir := t.TempDir()
	aside := dir + "/.destroy-0011223344556677"
	if err := os.MkdirAll(aside, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(aside+"/state.json", []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir+"/live", 0o700); err != nil {
		t.Fatal(err)
	}
	defer func(a time.Duration) { orphanAge = a }(orphanAge)
	orphanAge = time.Hour
	if r, err := sweepSetAside(dir); len(r) != 0 || err != nil {
		t.Fatalf("a young one went: %v %v", r, err)
	}
	orphanAge = -time.Hour
	if r, err := sweepSetAside(dir); len(r) != 1 || err != nil {
		t.Fatalf("sweep = %v %v", r, err)
	}
	if _, err := os.Stat(aside); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("still there: %v", err)
	}
	if _, err := os.Stat(dir + "/live"); err != nil {
		t.Fatalf("a sandbox's state went: %v", err)
	}
}
