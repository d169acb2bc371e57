// Package flock takes flock(2) locks (exclusive, or shared) on files and directories,
// the way managoat's processes keep out of each other's way on a state
// directory (a jail's sandbox, a Create's mark). The lock is on the open
// file description: it survives a rename of what it locks, is released
// with the descriptor or the process, and two opens in one process
// exclude each other like two processes do.
//
// Written here rather than taken from a library: it is three system
// calls, and the maintained lock libraries lock files they create, not
// the directory that is the state itself.
package flock

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive lock on the file or directory at path, waiting
// (polling every 5 ms) until it is free or ctx ends. unlock releases it.
func Lock(ctx context.Context, path string) (unlock func(), err error) {
	return lock(ctx, path, unix.LOCK_EX)
}

// LockShared takes a shared lock at path, as Lock does: any number of
// shared holders at once, none while an exclusive one holds it.
func LockShared(ctx context.Context, path string) (unlock func(), err error) {
	return lock(ctx, path, unix.LOCK_SH)
}

func lock(ctx context.Context, path string, how int) (unlock func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TryLock takes the lock at path if it is free; ok is false when someone
// holds it (or path cannot be opened).
func TryLock(path string) (unlock func(), ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, true
}

// Held reports whether someone holds the lock at path now.
func Held(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return err == unix.EWOULDBLOCK
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
