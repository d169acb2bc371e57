package spritestest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// fsError answers the filesystem API's error shape, {error, code, path},
// which @fly/sprites turns into a FilesystemError with the errno code.
func fsError(w http.ResponseWriter, err error, p string) {
	code, status := "EIO", http.StatusInternalServerError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code, status = "ENOENT", http.StatusNotFound
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which it also is
		code, status = "ENOTEMPTY", http.StatusConflict
	case errors.Is(err, fs.ErrExist):
		code, status = "EEXIST", http.StatusConflict
	case errors.Is(err, syscall.ENOTDIR):
		code, status = "ENOTDIR", http.StatusBadRequest
	case errors.Is(err, syscall.EISDIR):
		code, status = "EISDIR", http.StatusBadRequest
	case errors.Is(err, fs.ErrPermission):
		code, status = "EACCES", http.StatusForbidden
	case errors.Is(err, syscall.EINVAL):
		code, status = "EINVAL", http.StatusBadRequest
	}
	msg := err.Error()
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		msg = fmt.Sprintf("%s: %s '%s'", code, pe.Err, p)
	}
	writeJSON(w, status, map[string]any{"error": msg, "code": code, "path": p})
}

// entry is one fs/list entry.
func entry(name, p string, fi fs.FileInfo) map[string]any {
	typ := "file"
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		typ = "symlink"
	case fi.IsDir():
		typ = "directory"
	}
	return map[string]any{"name": name, "path": p, "size": fi.Size(), "mode": fmt.Sprintf("%04o", fi.Mode().Perm()),
		"modTime": fi.ModTime().UTC().Format(time.RFC3339Nano), "isDir": fi.IsDir(), "type": typ}
}

// spritePath is the sprite path p (relative to wd) as the sprite sees it.
func spritePath(p, wd string) string {
	if wd == "" {
		wd = "/"
	}
	if !strings.HasPrefix(p, "/") {
		p = wd + "/" + p
	}
	return filepath.Clean("/" + p)
}

// filesystem serves fs/read, fs/list, fs/delete, fs/rename, fs/copy and
// fs/chmod; false when route is none of them.
func (s *Server) filesystem(w http.ResponseWriter, r *http.Request, sp *sprite, route string, body []byte) bool {
	q := r.URL.Query()
	switch {
	case route == "fs/read" && r.Method == http.MethodGet:
		p := q.Get("path")
		if p == "" {
			apiError(w, http.StatusBadRequest, "invalid_request", "path is required")
			return true
		}
		if _, err := s.ensureDir(sp); err != nil {
			fsError(w, err, p)
			return true
		}
		full := sp.resolve(p, q.Get("workingDir"))
		f, err := os.Open(full)
		if err != nil {
			fsError(w, err, p)
			return true
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			fsError(w, err, p)
			return true
		}
		if fi.IsDir() {
			fsError(w, &fs.PathError{Op: "read", Path: p, Err: syscall.EISDIR}, p)
			return true
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", fi.ModTime(), f)
	case route == "fs/list" && r.Method == http.MethodGet:
		s.listDir(w, sp, q.Get("path"), q.Get("workingDir"), q.Get("recursive") == "true", q.Get("pattern"))
	case route == "fs/delete" && r.Method == http.MethodDelete:
		p := q.Get("path")
		if p == "" {
			apiError(w, http.StatusBadRequest, "invalid_request", "path is required")
			return true
		}
		if spritePath(p, q.Get("workingDir")) == "/" {
			fsError(w, &fs.PathError{Op: "rm", Path: p, Err: syscall.EINVAL}, p)
			return true
		}
		full := sp.resolve(p, q.Get("workingDir"))
		fi, err := os.Lstat(full)
		if err != nil {
			fsError(w, err, p)
			return true
		}
		if fi.IsDir() && q.Get("recursive") == "true" {
			err = os.RemoveAll(full)
		} else {
			err = os.Remove(full) // a non-empty directory is ENOTEMPTY
		}
		if err != nil {
			fsError(w, err, p)
			return true
		}
		writeJSON(w, http.StatusOK, map[string]any{"deleted": []string{spritePath(p, q.Get("workingDir"))}})
	case (route == "fs/rename" || route == "fs/copy") && r.Method == http.MethodPost:
		var req struct {
			Source, Dest, WorkingDir string
			Recursive                bool
		}
		if err := json.Unmarshal(body, &req); err != nil || req.Source == "" || req.Dest == "" {
			apiError(w, http.StatusBadRequest, "invalid_request", "source and dest are required")
			return true
		}
		src, dst := sp.resolve(req.Source, req.WorkingDir), sp.resolve(req.Dest, req.WorkingDir)
		var err error
		if route == "fs/rename" {
			err = os.Rename(src, dst)
		} else {
			err = copyPath(src, dst, req.Recursive)
		}
		if err != nil {
			fsError(w, err, req.Source)
			return true
		}
		writeJSON(w, http.StatusOK, map[string]any{"source": spritePath(req.Source, req.WorkingDir), "dest": spritePath(req.Dest, req.WorkingDir)})
	case route == "fs/chmod" && r.Method == http.MethodPost:
		var req struct {
			Path, WorkingDir, Mode string
		}
		var mode uint32
		if err := json.Unmarshal(body, &req); err != nil || req.Path == "" {
			apiError(w, http.StatusBadRequest, "invalid_request", "path and mode are required")
			return true
		}
		if _, err := fmt.Sscanf(req.Mode, "%o", &mode); err != nil || mode > 0o7777 {
			apiError(w, http.StatusBadRequest, "invalid_request", "mode must be octal")
			return true
		}
		if err := os.Chmod(sp.resolve(req.Path, req.WorkingDir), fs.FileMode(mode)); err != nil {
			fsError(w, err, req.Path)
			return true
		}
		writeJSON(w, http.StatusOK, map[string]any{"path": spritePath(req.Path, req.WorkingDir), "mode": fmt.Sprintf("%04o", mode)})
	default:
		return false
	}
	return true
}

// listDir answers {path, entries}: a directory's entries (every level
// below with recursive, names matching the glob pattern when given), or a
// file's own entry.
func (s *Server) listDir(w http.ResponseWriter, sp *sprite, p, wd string, recursive bool, pattern string) {
	if p == "" {
		p = "."
	}
	if _, err := s.ensureDir(sp); err != nil {
		fsError(w, err, p)
		return
	}
	if pattern != "" {
		if _, err := filepath.Match(pattern, ""); err != nil {
			apiError(w, http.StatusBadRequest, "invalid_request", "bad pattern")
			return
		}
	}
	full := sp.resolve(p, wd)
	vpath := spritePath(p, wd)
	fi, err := os.Lstat(full)
	if err != nil {
		fsError(w, err, p)
		return
	}
	entries := []map[string]any{}
	if !fi.IsDir() {
		entries = append(entries, entry(fi.Name(), vpath, fi))
		writeJSON(w, http.StatusOK, map[string]any{"path": vpath, "entries": entries})
		return
	}
	var walk func(dir, vdir string) error
	walk = func(dir, vdir string) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				continue
			}
			vp := filepath.Join(vdir, e.Name())
			if m, _ := filepath.Match(pattern, e.Name()); pattern == "" || m {
				name := e.Name()
				if recursive {
					name, _ = filepath.Rel(vpath, vp)
				}
				entries = append(entries, entry(name, vp, info))
			}
			if recursive && e.IsDir() {
				if err := walk(filepath.Join(dir, e.Name()), vp); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(full, vpath); err != nil {
		fsError(w, err, p)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": vpath, "entries": entries})
}

func copyPath(src, dst string, recursive bool) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if !recursive {
			return &fs.PathError{Op: "copy", Path: src, Err: syscall.EISDIR}
		}
		if err := os.MkdirAll(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := copyPath(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), true); err != nil {
				return err
			}
		}
		return nil
	}
	if !fi.Mode().IsRegular() {
		return &fs.PathError{Op: "copy", Path: src, Err: syscall.EINVAL}
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// execHTTP serves POST /v1/sprites/{name}/exec?cmd=…: the command runs
// with the request's body as its stdin (with stdin=true) and the answer
// streams one HTTP chunk per frame — a stream byte (1 stdout, 2 stderr)
// and its bytes — ending with the exit frame, 3 and the exit code's byte.
// The client reads frames by chunk boundary, so each is flushed alone. A
// client that goes away kills the command.
func (s *Server) execHTTP(w http.ResponseWriter, r *http.Request, sp *sprite, body []byte) {
	q := r.URL.Query()
	argv := q["cmd"]
	if len(argv) == 0 && q.Get("path") != "" {
		argv = []string{q.Get("path")}
	}
	if len(argv) == 0 || argv[0] == "" {
		apiError(w, http.StatusBadRequest, "invalid_request", "cmd is required")
		return
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		apiError(w, http.StatusServiceUnavailable, "unavailable", "shutting down")
		return
	}
	req := startReq{argv: argv, dir: q.Get("dir"), env: q["env"], stdin: q.Get("stdin") == "true", rows: 24, cols: 80}
	ss := newSession("")
	ss.command = strings.Join(argv, " ")
	s.start(sp, ss, req)
	ss.mu.Lock()
	in := ss.stdin
	ss.mu.Unlock()
	if in != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_, _ = in.Write(body)
			_ = in.Close()
		}()
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	next := 0
	var last time.Time
	send := func(chunk []byte) bool {
		// The SDK takes each read of the body for one frame, and its fetch
		// hands chunks that arrived together over in one read: frames are
		// spaced so that each arrives alone.
		if d := s.opts.HTTPExecFrameGap - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return false
			}
		}
		_, err := w.Write(chunk)
		if err == nil {
			err = rc.Flush()
		}
		last = time.Now()
		return err == nil
	}
	for {
		ss.mu.Lock()
		frames := ss.log[next:]
		ended, code, changed := ss.ended, ss.code, ss.changed
		ss.mu.Unlock()
		next += len(frames)
		// Consecutive frames of one stream go as one, up to 1 MiB.
		var pending []byte
		for _, f := range frames {
			if f.stream != frameStdout && f.stream != frameStderr {
				continue
			}
			if len(pending) > 0 && (pending[0] != f.stream || len(pending)+len(f.data) > 1<<20) {
				if !send(pending) {
					ss.kill()
					return
				}
				pending = nil
			}
			if len(pending) == 0 {
				pending = []byte{f.stream}
			}
			pending = append(pending, f.data...)
		}
		if len(pending) > 0 && !send(pending) {
			ss.kill()
			return
		}
		if ended {
			_ = send([]byte{frameExit, byte(code)})
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			ss.kill()
			return
		case <-s.ctx.Done():
			ss.kill()
			return
		}
	}
}
