package egress

import "golang.org/x/sys/unix"

func closeFD(fd int) { _ = unix.Close(fd) }

// WhenExits returns a channel closed when pid exits (a pidfd polled by a
// goroutine; closed at once when pid is not there), for Proxy.CloseWhen
// when the sandbox's init is not a child of this process.
func WhenExits(pid int) <-chan struct{} {
	done := make(chan struct{})
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		defer unix.Close(fd)
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, -1); n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	}()
	return done
}
