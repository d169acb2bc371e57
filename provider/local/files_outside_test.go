package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// guardHostPasswd fails the test if the host's /etc/passwd changes while
// it runs, and puts the old one back if it did (a previous change wrote
// it through the trusted mechanism's "sandbox" shell).
func guardHostPasswd(t *testing.T) {
	t.Helper()
	before, err := os.ReadFile("/etc/passwd")
	testenv.Require(t, err == nil, fmt.Sprintf("a host /etc/passwd to guard (%v)", err))
	sum := sha256.Sum256(before)
	t.Cleanup(func() {
		after, err := os.ReadFile("/etc/passwd")
		if got := sha256.Sum256(after); err != nil || got != sum {
			_ = os.WriteFile("/etc/passwd", before, 0o644)
			t.Errorf("THE HOST'S /etc/passwd CHANGED during the test (sha256 %s, was %s; %v): put back", hex.EncodeToString(got[:]), hex.EncodeToString(sum[:]), err)
		}
	})
}

func hostSum(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		return "absent"
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// outsideMechanisms is every mechanism this host runs that isolates a
// sandbox's files (root only; runc and runsc where installed).
func outsideMechanisms(t *testing.T) map[string]*Provider {
	t.Helper()
	testenv.RequireRoot(t)
	ps := map[string]*Provider{"jail": newJail(t)}
	for mech, bin := range map[string]string{"oci": "runc", "oci:runsc": "runsc"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Require(t, false, bin+" is not installed")
			continue
		}
		p, err := New(Config{StateDir: t.TempDir(), MechanismName: mech})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { destroyAll(p) })
		ps[mech] = p
	}
	return ps
}

func sh(t *testing.T, p *Provider, h *sandbox.Handle, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v exit %d %q", script, err, res.ExitCode, res.Output)
	}
	return string(res.Output)
}

// TestFilesOutsideTheHomeRefusedOnTrusted: under the trusted mechanism a
// path outside the home is refused, naming why, before anything runs: a
// host canary is tried first, then the host's /etc/passwd, by every route
// (absolute, ../ from the home, a symlink out of the home, /proc/self/root).
func TestFilesOutsideTheHomeRefusedOnTrusted(t *testing.T) {
	guardHostPasswd(t)
	p := newTrusted(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := p.Create(ctx, "outside-trusted", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var iv *sandbox.InvalidError
	err = p.WriteFile(ctx, h, canary, []byte("written through the files API\n"), sandbox.WriteFileOptions{})
	if b, _ := os.ReadFile(canary); string(b) != "host's own\n" || !errors.As(err, &iv) {
		t.Fatalf("WriteFile(a host canary) under trusted = %v and the canary holds %q: refuse before trying /etc/passwd", err, b)
	}
	if !strings.Contains(err.Error(), "mechanism trusted does not isolate") {
		t.Errorf("the refusal %q does not say why", err)
	}
	home := p.HostPath(h, "/home/sprite")
	if err := os.Symlink("/etc", filepath.Join(home, "etc")); err != nil {
		t.Fatal(err)
	}
	hostTmp := "/tmp/managoat-outside-" + newID()
	for _, bad := range []string{"/etc/passwd", "/home/sprite/../../etc/passwd", "../../etc/passwd", "etc/passwd",
		"/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd", hostTmp} {
		if err := p.WriteFile(ctx, h, bad, []byte("x:x:0:0::/:/bin/sh\n"), sandbox.WriteFileOptions{}); !errors.As(err, &iv) {
			t.Errorf("WriteFile(%q) under trusted = %v, want Invalid", bad, err)
		}
		if _, err := p.ReadFile(ctx, h, bad); !errors.As(err, &iv) {
			t.Errorf("ReadFile(%q) under trusted = %v, want Invalid", bad, err)
		}
		if _, _, err := p.OpenFile(ctx, h, bad); !errors.As(err, &iv) {
			t.Errorf("OpenFile(%q) under trusted = %v, want Invalid", bad, err)
		}
	}
	if _, err := os.Lstat(hostTmp); err == nil {
		os.Remove(hostTmp)
		t.Errorf("a WriteFile under trusted made the host's %s", hostTmp)
	}
}

// TestFilesOutsideTheHome: on every mechanism that isolates the
// sandbox's files, the files API reaches /tmp (a tmpfs the host does not
// see) and the image's tree as cp does, from inside the sandbox as its
// user; every trick aimed at the host's /etc/passwd lands in the
// sandbox or is refused, and the host's file is unchanged.
func TestFilesOutsideTheHome(t *testing.T) {
	guardHostPasswd(t)
	for mech, p := range outsideMechanisms(t) {
		t.Run(strings.ReplaceAll(mech, ":", "-"), func(t *testing.T) {
			t.Parallel()
			testFilesOutside(t, p)
		})
	}
}

func testFilesOutside(t *testing.T, p *Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h, err := p.Create(ctx, "outside-home", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	passwd := hostSum(t, "/etc/passwd")
	dir := "/tmp/managoat-outside-" + newID()

	payload := make([]byte, 3<<20+17) // several pipe fills, not a round size
	_, _ = rand.Read(payload)
	if err := p.WriteFile(ctx, h, dir+"/a/b.bin", payload, sandbox.WriteFileOptions{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if got, err := p.ReadFile(ctx, h, dir+"/a/b.bin"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("ReadFile = %d bytes, %v; want the %d written", len(got), err, len(payload))
	}
	// The sandbox sees it where it was written, as its own user, with the
	// mode asked; the host's /tmp has nothing of it. (find, not stat:
	// gVisor refuses coreutils' statx with EINVAL.)
	f := strings.Fields(sh(t, p, h, "find "+dir+"/a/b.bin -printf '%m %U\\n'; id -u; sha256sum < "+dir+"/a/b.bin"))
	sum := sha256.Sum256(payload)
	if len(f) < 4 || f[0] != "600" || f[1] != f[2] || f[3] != hex.EncodeToString(sum[:]) {
		t.Fatalf("in the sandbox: %q (want mode 600, owned by the sandbox's user, the bytes written)", f)
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Fatalf("the host has %s: the write did not stay in the sandbox", dir)
	}
	// A file a command made, read back; a missing one; a directory.
	sh(t, p, h, "printf 'made in the sandbox\\n' > "+dir+"/made")
	if got, err := p.ReadFile(ctx, h, dir+"/made"); err != nil || string(got) != "made in the sandbox\n" {
		t.Errorf("ReadFile(a command's file) = %q, %v", got, err)
	}
	if _, err := p.ReadFile(ctx, h, dir+"/none"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile(missing) = %v, want ErrNotFound", err)
	}
	var iv *sandbox.InvalidError
	if _, err := p.ReadFile(ctx, h, dir+"/a"); !errors.As(err, &iv) {
		t.Errorf("ReadFile(a directory) = %v, want Invalid", err)
	}
	if err := p.WriteFile(ctx, h, dir+"/a", []byte("x"), sandbox.WriteFileOptions{}); !errors.As(err, &iv) {
		t.Errorf("WriteFile(over a directory) = %v, want Invalid", err)
	}
	// The image's tree: readable as the sandbox reads it.
	inside := sh(t, p, h, "cat /etc/passwd")
	for _, name := range []string{"/etc/passwd", "/proc/self/root/etc/passwd", "/home/sprite/../../etc/passwd", "/tmp/../etc/./passwd"} {
		if got, err := p.ReadFile(ctx, h, name); err != nil || string(got) != inside {
			t.Errorf("ReadFile(%s) = %d bytes, %v; want the sandbox's /etc/passwd (%d bytes)", name, len(got), err, len(inside))
		}
	}

	// Writes aimed at the host's /etc/passwd.
	sh(t, p, h, "ln -s /etc/passwd "+dir+"/evil; ln -s /etc "+dir+"/etc; ln -s /proc/1/root "+dir+"/root1")
	if err := os.Symlink("/etc", filepath.Join(p.HostPath(h, "/home/sprite"), "etc")); err != nil {
		t.Fatal(err)
	}
	evil := []byte("evil::0:0::/:/bin/sh\n")
	for _, name := range []string{"/etc/passwd", "/home/sprite/../../etc/passwd", "/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd",
		dir + "/etc/passwd", dir + "/root1/etc/passwd", "/proc/self/cwd/etc/passwd"} {
		if err := p.WriteFile(ctx, h, name, evil, sandbox.WriteFileOptions{}); err == nil {
			t.Errorf("WriteFile(%s) succeeded: the sandbox's user cannot write its /etc", name)
		}
	}
	// Relative escapes, and a symlink in the home out of it, stay Invalid.
	for _, name := range []string{"../../etc/passwd", "etc/passwd"} {
		if err := p.WriteFile(ctx, h, name, evil, sandbox.WriteFileOptions{}); !errors.As(err, &iv) {
			t.Errorf("WriteFile(%s) = %v, want Invalid", name, err)
		}
		if _, err := p.ReadFile(ctx, h, name); !errors.As(err, &iv) {
			t.Errorf("ReadFile(%s) = %v, want Invalid", name, err)
		}
	}
	// A symlink at the path is replaced, never written through.
	if err := p.WriteFile(ctx, h, dir+"/evil", []byte("replaced\n"), sandbox.WriteFileOptions{}); err != nil {
		t.Errorf("WriteFile(over a symlink) = %v", err)
	}
	if out := sh(t, p, h, "cat "+dir+"/evil; [ -L "+dir+"/evil ] && echo still a link; cat /etc/passwd"); out != "replaced\n"+inside {
		t.Errorf("after the write over the symlink the sandbox shows %q", out)
	}
	if got := hostSum(t, "/etc/passwd"); got != passwd {
		t.Fatalf("the host's /etc/passwd changed (%s, was %s)", got, passwd)
	}

	// A source that fails midway, or a context that ends, leaves the old
	// content and no temporary file.
	broken := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("y"), 200<<10)), iotest.ErrReader(errors.New("client gone")))
	if err := p.WriteFileFrom(ctx, h, dir+"/a/b.bin", broken, sandbox.WriteFileOptions{}); err == nil || !strings.Contains(err.Error(), "client gone") {
		t.Fatalf("WriteFileFrom(failing source) = %v, want its error", err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte("z"), 100<<10))
		ccancel()
		pw.Close()
	}()
	if err := p.WriteFileFrom(cctx, h, dir+"/a/b.bin", pr, sandbox.WriteFileOptions{}); err == nil {
		t.Fatal("WriteFileFrom with a context that ended midway succeeded")
	}
	if got, err := p.ReadFile(ctx, h, dir+"/a/b.bin"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("after failed writes: %d bytes, %v; want the old %d", len(got), err, len(payload))
	}
	if out := strings.TrimSpace(sh(t, p, h, "find "+dir+"/a -mindepth 1 -printf '%f\\n'")); out != "b.bin" {
		t.Fatalf("after failed writes %s/a holds %q: a temporary file was left", dir, out)
	}
	// None of it is a session.
	if ss, err := p.ListSessions(ctx, h); err != nil {
		t.Fatal(err)
	} else {
		for _, s := range ss {
			if strings.Contains(s.Command, "managoat-write") || strings.Contains(s.Command, "wc -c") {
				t.Errorf("a files API command is listed as a session: %q", s.Command)
			}
		}
	}

	// A hostile sandbox: its wc and cat are its own (first on its PATH).
	sh(t, p, h, "printf abc > "+dir+"/short")
	for _, tc := range []struct{ wc, cat, want string }{
		{"echo -5", "", "size line"},
		{"echo +3", "", "size line"},
		{"echo 3x", "", "size line"},
		{"echo 12345678901234567890123", "", "no size line"},
		{"printf 'x%.0s' $(seq 100)", "", "no size line"},
		{"echo 1000", "", "unexpected EOF"},                                                         // more than the file holds
		{"echo 99999999999999", "", "file_too_large"},                                               // ReadFile refuses before reading
		{"", "exec yes", ""},                                                                        // more than announced: cut at 3
		{"", "head -c 100000 /dev/zero >&2; exit 3", "exit 3"},                                      // a stderr flood: one bounded line
		{"", "printf 'a\\033]0;x\\007\\n' >&2; exit 4", "a?]0;x?"},                                  // controls in its stderr
		{"", "printf ab; exec sleep 600", "context deadline exceeded"},                              // a cat that stalls
		{"", "printf ab; (trap '' TERM; setsid sleep 600 &) ; exit 0", "context deadline exceeded"}, // stdout held by a process that left
	} {
		sh(t, p, h, "rm -f /home/sprite/.local/bin/wc /home/sprite/.local/bin/cat")
		for tool, body := range map[string]string{"wc": tc.wc, "cat": tc.cat} {
			if body == "" {
				continue
			}
			if err := p.WriteFile(ctx, h, ".local/bin/"+tool, []byte("#!/bin/sh\n"+body+"\n"), sandbox.WriteFileOptions{Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
		}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := p.ReadFile(rctx, h, dir+"/short")
		rcancel()
		switch {
		case tc.want == "" && (err != nil || len(got) != 3):
			t.Errorf("wc %q cat %q: ReadFile = %q, %v; want the 3 bytes announced", tc.wc, tc.cat, got, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 1024):
			t.Errorf("wc %q cat %q: ReadFile = %q, %.300v; want a short error about %q", tc.wc, tc.cat, got, err, tc.want)
		}
	}
	sh(t, p, h, "rm -f /home/sprite/.local/bin/wc /home/sprite/.local/bin/cat")
	if got, err := p.ReadFile(ctx, h, dir+"/short"); err != nil || string(got) != "abc" {
		t.Errorf("with the tools back: %q, %v", got, err)
	}
	if got := hostSum(t, "/etc/passwd"); got != passwd {
		t.Fatalf("the host's /etc/passwd changed (%s, was %s)", got, passwd)
	}
}
