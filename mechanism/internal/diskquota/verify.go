package diskquota

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Verify does what a sandbox's home gets, once, in a throwaway directory
// made in dir: Probe's method with a 1 MiB limit, then a write of 2 MiB as
// uid 65534 (root is exempt from a project quota; the sandbox's user is
// not), which must fail short of the limit. It returns the method with the
// evidence, or none with the reason. It takes tens of milliseconds (the
// doctor runs it; Probe is what a launch asks).
func Verify(ctx context.Context, dir string, userns bool) Support {
	s := Probe(dir, userns)
	if !s.Available() {
		return s
	}
	tmp, err := os.MkdirTemp(dir, ".diskquota-verify-")
	if err != nil {
		return Support{Detail: fmt.Sprintf("%s picked, but no directory to try it in: %v", s.Method, err)}
	}
	defer os.RemoveAll(tmp)
	home := filepath.Join(tmp, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		return Support{Detail: err.Error()}
	}
	start := time.Now()
	q, err := Apply(ctx, home, MinBytes, Options{Method: s.Method, Image: filepath.Join(tmp, "home.img"), UID: 65534, GID: 65534})
	if err != nil {
		return Support{Detail: fmt.Sprintf("%s tried and failed: %v", s.Method, err)}
	}
	took := time.Since(start)
	defer q.Release(home)
	n, out, err := Fill(ctx, filepath.Join(home, "fill"), 2<<20, 65534)
	if err == nil {
		return Support{Detail: fmt.Sprintf("%s tried: a write of 2 MiB under a 1 MiB limit succeeded", s.Method)}
	}
	if n > MinBytes {
		return Support{Detail: fmt.Sprintf("%s tried: %d bytes written under a 1 MiB limit", s.Method, n)}
	}
	var why string
	switch {
	case strings.Contains(out, "No space left"):
		why = "no space left on device"
	case strings.Contains(out, "Disk quota exceeded"):
		why = "disk quota exceeded"
	default:
		return Support{Detail: fmt.Sprintf("%s tried, but the write failed otherwise: %v: %s", s.Method, err, out)}
	}
	if rerr := q.Release(home); rerr != nil {
		return Support{Detail: fmt.Sprintf("%s tried, but releasing it failed: %v", s.Method, rerr)}
	}
	return Support{Method: s.Method, Detail: fmt.Sprintf("%s; tried: set up in %v, a 2 MiB write under a 1 MiB limit stopped (%s)", s.Detail, took.Round(time.Millisecond), why)}
}

// Fill writes size bytes of zeros to a new file at path as uid (gid the
// same) with dd, the file opened by the caller (so uid need not reach
// path), and returns the bytes the file holds, dd's output and its error.
// Tests and Verify use it to see a limit hold for an unprivileged writer.
func Fill(ctx context.Context, path string, size int64, uid int) (int64, string, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	if err := f.Chown(uid, uid); err != nil {
		return 0, "", err
	}
	cmd := exec.CommandContext(ctx, "dd", "if=/dev/zero", "bs=64k", fmt.Sprintf("count=%d", (size+65535)/65536))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout = f
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	err = cmd.Run()
	var n int64
	if fi, serr := f.Stat(); serr == nil {
		n = fi.Size()
	}
	return n, stderr.String(), err
}
