package egress

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCloseWakesARequest: closing a socket factory while a request waits
// for a helper that does not answer ends the request at once (it fails
// as closed), rather than when the answer's timeout expires.
func TestCloseWakesARequest(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A helper that reads requests and never answers, and exits on EOF.
	theirs := os.NewFile(uintptr(pair[1]), "helper")
	cmd := exec.Command("cat")
	cmd.Stdin = theirs
	if err := cmd.Start(); err != nil {
		theirs.Close()
		unix.Close(pair[0])
		t.Fatal(err)
	}
	theirs.Close()
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, stderr: &boundedBuffer{max: 64}, exited: make(chan struct{}), fd: pair[0]}
	go func() { h.werr = cmd.Wait(); close(h.exited) }()
	_ = unix.SetsockoptTimeval(h.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: int64(helperAnswerTimeout / time.Second)})
	f := &socketFactory{pid: cmd.Process.Pid, pidfd: pidfd, started: time.Now()}
	f.cur.Store(h)
	errc := make(chan error, 1)
	go func() {
		s, err := f.socket()
		if err == nil {
			unix.Close(s)
		}
		errc <- err
	}()
	// The request holds the lock while it waits for the answer.
	for deadline := time.Now().Add(10 * time.Second); f.mu.TryLock(); time.Sleep(time.Millisecond) {
		f.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the request never began")
		}
	}
	f.close()
	err = <-errc
	if err == nil || strings.Contains(err.Error(), "no answer") {
		t.Errorf("the request under way at close ended with %v, want it cut short", err)
	}
	if _, err := f.socket(); err == nil {
		t.Error("a closed factory made a socket")
	}
}
