package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// TestFilesOutsideTheHome: the files API reaches /tmp (a tmpfs the host
// does not see) as cp does, through a command in the sandbox as its
// user; what the sandbox sends back is bounded, and a failing source
// leaves the target as it was.
func TestFilesOutsideTheHome(t *testing.T) {
	p := newJail(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := p.Create(ctx, "outside-home", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), h) })

	payload := make([]byte, 3<<20+17) // several stream chunks, not a round size
	_, _ = rand.Read(payload)
	if err := p.WriteFile(ctx, h, "/tmp/a/b.bin", payload, sandbox.WriteFileOptions{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	got, err := p.ReadFile(ctx, h, "/tmp/a/b.bin")
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("ReadFile = %d bytes, %v; want the %d written", len(got), err, len(payload))
	}
	// The sandbox sees it where it was written, as its own user, with the mode asked.
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", `stat -c '%a %u' /tmp/a/b.bin; id -u; sha256sum < /tmp/a/b.bin`}}, sandbox.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("stat in the sandbox: %v %+v", err, res)
	}
	lines := strings.Fields(string(res.Output))
	if len(lines) < 3 || lines[0] != "600" || lines[1] != lines[2] {
		t.Fatalf("in the sandbox: %q (want mode 600, owned by the sandbox's user)", res.Output)
	}
	// Nothing of /tmp is on the host's side of the home.
	if _, err := os.Stat(p.HostPath(h, "/tmp/a/b.bin")); err == nil {
		t.Fatal("HostPath of /tmp names a host file")
	}

	// Missing, a directory, and a path only the sandbox's root may write.
	if _, err := p.ReadFile(ctx, h, "/tmp/nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("ReadFile(/tmp/nope) = %v, want ErrNotFound", err)
	}
	var iv *sandbox.InvalidError
	if _, err := p.ReadFile(ctx, h, "/tmp/a"); !errors.As(err, &iv) {
		t.Errorf("ReadFile(a directory) = %v, want Invalid", err)
	}
	if err := p.WriteFile(ctx, h, "/tmp/a", []byte("x"), sandbox.WriteFileOptions{}); !errors.As(err, &iv) {
		t.Errorf("WriteFile(over a directory) = %v, want Invalid", err)
	}
	if err := p.WriteFile(ctx, h, "/etc/managoat-test", []byte("x"), sandbox.WriteFileOptions{}); err == nil {
		t.Error("WriteFile(/etc/...) succeeded: the sandbox's user cannot write there")
	}
	if _, err := os.Stat("/etc/managoat-test"); err == nil {
		_ = os.Remove("/etc/managoat-test")
		t.Fatal("a write to the sandbox's /etc reached the host's")
	}

	// A source that fails midway leaves the old content and no temporary file.
	broken := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("y"), 200<<10)), iotest.ErrReader(errors.New("client gone")))
	if err := p.WriteFileFrom(ctx, h, "/tmp/a/b.bin", broken, sandbox.WriteFileOptions{}); err == nil || !strings.Contains(err.Error(), "client gone") {
		t.Fatalf("WriteFileFrom(failing source) = %v, want its error", err)
	}
	if got, err := p.ReadFile(ctx, h, "/tmp/a/b.bin"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("after a failed write: %d bytes, %v; want the old %d", len(got), err, len(payload))
	}
	res, err = p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "ls -A /tmp/a"}}, sandbox.ExecOptions{})
	if err != nil || strings.TrimSpace(string(res.Output)) != "b.bin" {
		t.Fatalf("after a failed write /tmp/a holds %q (%v): a temporary file was left", res.Output, err)
	}

	// A hostile size line: the sandbox's own sh, wc and cat are its to
	// replace; the reader believes at most what arrives, and a short file
	// is an error, not a silent truncation.
	if _, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "printf abc > /tmp/short"}}, sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	rc, size, err := p.OpenFile(ctx, h, "/tmp/short")
	if err != nil || size != 3 {
		t.Fatalf("OpenFile = %d, %v", size, err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "abc" {
		t.Fatalf("read %q, %v", b, err)
	}
	for _, tc := range []struct{ wc, want string }{
		{"echo -5", "size"},
		{"echo 12345678901234567890123", "size"},
		{"printf 'x%.0s' $(seq 100)", "no size line"},
		{"echo 1000", "unexpected EOF"}, // more than the file holds
	} {
		if err := p.WriteFile(ctx, h, ".local/bin/wc", []byte("#!/bin/sh\n"+tc.wc+"\n"), sandbox.WriteFileOptions{Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
		_, err := p.ReadFile(ctx, h, "/tmp/short")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("with a wc that runs %q: ReadFile = %v, want an error about %q", tc.wc, err, tc.want)
		}
	}
}
