package api

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"sync"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// Files. PUT and GET /v1/sandboxes/{name}/files stream: a read copies the
// provider's reader (sandbox.Registry.OpenFile: provider/local streams
// the file; a provider without a stream gives its bounded ReadFile) to
// the response through a 64 KiB buffer, with the file's size as
// Content-Length; a write streams the body (at most Config.MaxFile bytes,
// 413 past it) to the provider (Registry.WriteFileFrom), so a transfer
// holds a buffer, not the file, whatever its size.
//
// An account has at most Config.FileTransfersPerAccount (default
// DefaultFileTransfersPerAccount) reads and writes under way at once on
// this server, all its keys and sandboxes together: one more is 429
// rate_limited{file_transfers} with Retry-After, answered before the
// sandbox is touched (or woken).

// DefaultFileTransfersPerAccount is Config.FileTransfersPerAccount's
// default.
const DefaultFileTransfersPerAccount = 4

// fileBuf is the buffer one transfer copies through.
const fileBuf = 64 << 10

var fileBufs = sync.Pool{New: func() any { b := make([]byte, fileBuf); return &b }}

// fileSlots counts each account's transfers under way (its zero value is
// ready).
type fileSlots struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *Server) fileTransfersMax() int {
	if s.cfg.FileTransfersPerAccount > 0 {
		return s.cfg.FileTransfersPerAccount
	}
	return DefaultFileTransfersPerAccount
}

// fileSlot takes one of the account's transfers, or writes the 429 and
// says no. release gives it back.
func (s *Server) fileSlot(w http.ResponseWriter, accountID string) (release func(), ok bool) {
	fs := &s.files
	fs.mu.Lock()
	defer fs.mu.Unlock()
	max := s.fileTransfersMax()
	if fs.n[accountID] >= max {
		w.Header().Set("Retry-After", "1")
		writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "file_transfers", RetryAfterMS: 1000,
			Message: fmt.Sprintf("this account has %d file reads and writes under way, the most it may: retry when one ends", max)}})
		return nil, false
	}
	if fs.n == nil {
		fs.n = map[string]int{}
	}
	fs.n[accountID]++
	return func() {
		fs.mu.Lock()
		if fs.n[accountID]--; fs.n[accountID] <= 0 {
			delete(fs.n, accountID)
		}
		fs.mu.Unlock()
	}, true
}

// FileTransfers is how many file transfers of the account are under way
// on this server.
func (s *Server) FileTransfers(accountID string) int {
	s.files.mu.Lock()
	defer s.files.mu.Unlock()
	return s.files.n[accountID]
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, k store.Key) {
	path := r.URL.Query().Get("path")
	if path == "" {
		writeErr(w, noPath())
		return
	}
	var mode fs.FileMode
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			writeErr(w, badJSON("mode", "mode must be octal permission bits, e.g. 644"))
			return
		}
		mode = fs.FileMode(n)
	}
	if r.ContentLength > s.cfg.MaxFile {
		writeErr(w, tooLarge(fmt.Errorf("%d bytes, more than %d", r.ContentLength, s.cfg.MaxFile)))
		return
	}
	release, ok := s.fileSlot(w, k.AccountID)
	if !ok {
		return
	}
	defer release()
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxFile)
	err := sandbox.NewRegistry(p).WriteFileFrom(r.Context(), handleOf(rec), path, body, sandbox.WriteFileOptions{Mode: mode})
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeErr(w, tooLarge(err))
		return
	case err != nil:
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, k store.Key) {
	if r.URL.Query().Get("path") == "" {
		writeErr(w, noPath())
		return
	}
	release, ok := s.fileSlot(w, k.AccountID)
	if !ok {
		return
	}
	defer release()
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	rc, size, err := sandbox.NewRegistry(p).OpenFile(r.Context(), handleOf(rec), r.URL.Query().Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	buf := fileBufs.Get().(*[]byte)
	defer fileBufs.Put(buf)
	// Content-Length is said: a file that shrank while read ends the
	// response short, which the client sees as a broken transfer.
	_, _ = io.CopyBuffer(w, io.LimitReader(struct{ io.Reader }{rc}, size), *buf)
}
