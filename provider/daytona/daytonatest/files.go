package daytonatest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// Generation is which toolbox file routes the fake plays.
type Generation int

const (
	// Current is the current service, as the 0.218 toolbox client calls
	// it: single-file uploads at POST /files/upload-v2; /files/upload is an
	// unknown route (404).
	Current Generation = iota
	// Daemon0190 is the public daemon at v0.190.0: single-file uploads at
	// POST /files/upload; /files/upload-v2 is an unknown route (404).
	Daemon0190
)

func (g Generation) String() string {
	if g == Daemon0190 {
		return "daemon-v0.190.0"
	}
	return "current"
}

// MaxUpload bounds one upload request's body (single or bulk).
const MaxUpload = 256 << 20

// fileInfo is the toolbox's FileInfo.
func fileInfo(p string, fi fs.FileInfo) map[string]any {
	owner, group := "daytona", "daytona"
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
		owner, group = "root", "root"
	}
	mt := fi.ModTime().UTC().Format(time.RFC3339Nano)
	return map[string]any{
		"name": fi.Name(), "path": p, "isDir": fi.IsDir(), "size": fi.Size(),
		"mode": fi.Mode().String(), "permissions": fmt.Sprintf("%#o", fi.Mode().Perm()),
		"modTime": mt, "modifiedAt": mt, "owner": owner, "group": group,
	}
}

// toolboxPath maps a query parameter through hostPath, answering 403 (or
// 400 when absent) itself; ok is false when it answered.
func (s *Server) toolboxPath(w http.ResponseWriter, sb *Sandbox, p string) (string, bool) {
	if p == "" {
		apiError(w, http.StatusBadRequest, "path is required")
		return "", false
	}
	hp, err := s.hostPath(sb, p)
	if err != nil {
		apiError(w, http.StatusForbidden, err.Error())
		return "", false
	}
	return hp, true
}

func statError(w http.ResponseWriter, err error) {
	if errors.Is(err, fs.ErrNotExist) {
		apiError(w, http.StatusNotFound, "file not found")
		return
	}
	apiError(w, http.StatusBadRequest, err.Error())
}

// files serves the toolbox's file routes other than download; false when
// sub is none of them.
func (s *Server) files(w http.ResponseWriter, r *http.Request, sb *Sandbox, sub string) bool {
	q := r.URL.Query()
	switch {
	case sub == "/files/upload" && r.Method == http.MethodPost && s.Generation == Daemon0190,
		sub == "/files/upload-v2" && r.Method == http.MethodPost && s.Generation == Current:
		s.upload(w, r, sb)
	case sub == "/files" && r.Method == http.MethodGet:
		s.listFiles(w, sb, q.Get("path"), q.Get("depth"))
	case sub == "/files" && r.Method == http.MethodDelete:
		p, ok := s.toolboxPath(w, sb, q.Get("path"))
		if !ok {
			return true
		}
		fi, err := os.Lstat(p)
		if err != nil {
			statError(w, err)
			return true
		}
		if fi.IsDir() && q.Get("recursive") != "true" {
			apiError(w, http.StatusBadRequest, "cannot delete directory without recursive flag")
			return true
		}
		if err := os.RemoveAll(p); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return true
		}
		w.WriteHeader(http.StatusNoContent)
	case sub == "/files/folder" && r.Method == http.MethodPost:
		p, ok := s.toolboxPath(w, sb, q.Get("path"))
		if !ok {
			return true
		}
		mode := uint64(0o755)
		if m := q.Get("mode"); m != "" {
			v, err := strconv.ParseUint(m, 8, 32)
			if err != nil || v > 0o7777 {
				apiError(w, http.StatusBadRequest, "invalid mode format")
				return true
			}
			mode = v
		}
		if err := os.MkdirAll(p, os.FileMode(mode)); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return true
		}
		_ = os.Chmod(p, os.FileMode(mode))
		w.WriteHeader(http.StatusCreated)
	case sub == "/files/info" && r.Method == http.MethodGet:
		p, ok := s.toolboxPath(w, sb, q.Get("path"))
		if !ok {
			return true
		}
		fi, err := os.Stat(p)
		if err != nil {
			statError(w, err)
			return true
		}
		writeJSON(w, http.StatusOK, fileInfo(p, fi))
	case sub == "/files/move" && r.Method == http.MethodPost:
		src, ok := s.toolboxPath(w, sb, q.Get("source"))
		if !ok {
			return true
		}
		dst, ok := s.toolboxPath(w, sb, q.Get("destination"))
		if !ok {
			return true
		}
		if _, err := os.Lstat(src); err != nil {
			statError(w, err)
			return true
		}
		if err := os.Rename(src, dst); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return true
		}
		w.WriteHeader(http.StatusOK)
	case sub == "/files/permissions" && r.Method == http.MethodPost:
		p, ok := s.toolboxPath(w, sb, q.Get("path"))
		if !ok {
			return true
		}
		if m := q.Get("mode"); m != "" {
			v, err := strconv.ParseUint(m, 8, 32)
			if err != nil || v > 0o7777 {
				apiError(w, http.StatusBadRequest, "invalid mode format")
				return true
			}
			if err := os.Chmod(p, os.FileMode(v)); err != nil {
				statError(w, err)
				return true
			}
		}
		if q.Get("owner") != "" || q.Get("group") != "" {
			// The fake's processes run as the test's user: it cannot chown.
			apiError(w, http.StatusBadRequest, "daytonatest: changing owner or group is not supported")
			return true
		}
		w.WriteHeader(http.StatusOK)
	case sub == "/files/search" && r.Method == http.MethodGet:
		s.searchFiles(w, sb, q.Get("path"), q.Get("pattern"))
	case sub == "/files/find" && r.Method == http.MethodGet:
		s.findInFiles(w, sb, q.Get("path"), q.Get("pattern"))
	case sub == "/files/replace" && r.Method == http.MethodPost:
		s.replaceInFiles(w, r, sb)
	case sub == "/files/bulk-upload" && r.Method == http.MethodPost:
		s.bulkUpload(w, r, sb)
	case sub == "/files/bulk-download" && r.Method == http.MethodPost:
		s.bulkDownload(w, r, sb)
	default:
		return false
	}
	return true
}

func (s *Server) listFiles(w http.ResponseWriter, sb *Sandbox, path, depth string) {
	if path == "" {
		path = "."
	}
	root, ok := s.toolboxPath(w, sb, path)
	if !ok {
		return
	}
	max := 1
	if depth != "" {
		n, err := strconv.Atoi(depth)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "depth must be an integer of at least 1")
			return
		}
		max = n
	}
	fi, err := os.Stat(root)
	if err != nil {
		statError(w, err)
		return
	}
	if !fi.IsDir() {
		apiError(w, http.StatusBadRequest, "path is not a directory")
		return
	}
	out := []map[string]any{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				continue
			}
			p := filepath.Join(dir, e.Name())
			out = append(out, fileInfo(p, info))
			if e.IsDir() && level < max {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		statError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// searchFiles answers the paths under path whose base name matches the
// glob pattern (the daemon's filepath.Match on each name).
func (s *Server) searchFiles(w http.ResponseWriter, sb *Sandbox, path, pattern string) {
	root, ok := s.toolboxPath(w, sb, path)
	if !ok {
		return
	}
	if _, err := filepath.Match(pattern, ""); err != nil || pattern == "" {
		apiError(w, http.StatusBadRequest, "invalid pattern")
		return
	}
	files := []string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if m, _ := filepath.Match(pattern, d.Name()); m {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		statError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"files": files})
}

// findInFiles answers each line under path containing pattern (a fixed
// string, as the daemon's grep -F).
func (s *Server) findInFiles(w http.ResponseWriter, sb *Sandbox, path, pattern string) {
	root, ok := s.toolboxPath(w, sb, path)
	if !ok {
		return
	}
	if pattern == "" {
		apiError(w, http.StatusBadRequest, "pattern is required")
		return
	}
	matches := []map[string]any{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for n := 1; sc.Scan(); n++ {
			if strings.Contains(sc.Text(), pattern) {
				matches = append(matches, map[string]any{"file": p, "line": n, "content": sc.Text()})
			}
		}
		return nil
	})
	writeJSON(w, http.StatusOK, matches)
}

func (s *Server) replaceInFiles(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	var req struct {
		Files    []string `json:"files"`
		Pattern  string   `json:"pattern"`
		NewValue *string  `json:"newValue"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Pattern == "" || req.NewValue == nil {
		apiError(w, http.StatusBadRequest, "files, pattern and newValue are required")
		return
	}
	re, err := regexp.Compile(req.Pattern)
	if err != nil {
		apiError(w, http.StatusBadRequest, "invalid pattern: "+err.Error())
		return
	}
	out := []map[string]any{}
	for _, f := range req.Files {
		res := map[string]any{"file": f}
		p, err := s.hostPath(sb, f)
		var data []byte
		if err == nil {
			data, err = os.ReadFile(p)
		}
		if err == nil {
			err = os.WriteFile(p, re.ReplaceAll(data, []byte(*req.NewValue)), 0o644)
		}
		res["success"] = err == nil
		if err != nil {
			res["error"] = err.Error()
		}
		out = append(out, res)
	}
	writeJSON(w, http.StatusOK, out)
}

var bulkField = regexp.MustCompile(`^files\[(\d{1,6})\]\.(path|file)$`)

// bulkUpload takes multipart fields files[i].path (the destination) and
// files[i].file (its bytes), in either order, streaming each file to a
// temporary beside its destination.
func (s *Server) bulkUpload(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxUpload)
	mr, err := r.MultipartReader()
	if err != nil {
		apiError(w, http.StatusBadRequest, "multipart body is required")
		return
	}
	paths := map[string]string{}
	staged := map[string]string{} // index → temporary file
	defer func() {
		for _, t := range staged {
			_ = os.Remove(t)
		}
	}()
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			apiError(w, http.StatusBadRequest, "malformed multipart body: "+err.Error())
			return
		}
		m := bulkField.FindStringSubmatch(part.FormName())
		if m == nil {
			_ = part.Close()
			continue
		}
		switch m[2] {
		case "path":
			b, err := io.ReadAll(io.LimitReader(part, 4097))
			if err != nil || len(b) > 4096 {
				apiError(w, http.StatusBadRequest, "bad path field")
				return
			}
			paths[m[1]] = string(b)
		case "file":
			t, err := os.CreateTemp(filepath.Join(sb.dir, "tmp"), ".bulk-upload-*")
			if err != nil {
				apiError(w, http.StatusInternalServerError, err.Error())
				return
			}
			staged[m[1]] = t.Name()
			_, err = io.Copy(t, part)
			if cerr := t.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				apiError(w, http.StatusBadRequest, "reading file: "+err.Error())
				return
			}
		}
	}
	for i, t := range staged {
		p, ok := paths[i]
		if !ok {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("files[%s].path is missing", i))
			return
		}
		dst, err := s.hostPath(sb, p)
		if err != nil {
			apiError(w, http.StatusForbidden, err.Error())
			return
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		if err := os.Rename(t, dst); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		_ = os.Chmod(dst, 0o644)
		delete(staged, i)
	}
	w.WriteHeader(http.StatusOK)
}

// bulkDownload answers multipart/form-data: per asked path a part named
// "file" (filename the path as asked) with its bytes, or one named
// "error" with a JSON {message, statusCode, code}.
func (s *Server) bulkDownload(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	var req struct {
		Paths []string `json:"paths"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.Paths) == 0 {
		apiError(w, http.StatusBadRequest, "paths are required")
		return
	}
	mw := multipart.NewWriter(w)
	w.Header().Set("Content-Type", "multipart/form-data; boundary="+mw.Boundary())
	w.WriteHeader(http.StatusOK)
	for _, p := range req.Paths {
		part := func(name, ctype string, size int64) (io.Writer, error) {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, name, p))
			h.Set("Content-Type", ctype)
			if size >= 0 {
				h.Set("Content-Length", strconv.FormatInt(size, 10))
			}
			return mw.CreatePart(h)
		}
		fail := func(status int, code, msg string) {
			b, _ := json.Marshal(map[string]any{"message": msg, "statusCode": status, "code": code})
			if pw, err := part("error", "application/json", int64(len(b))); err == nil {
				_, _ = pw.Write(b)
			}
		}
		hp, err := s.hostPath(sb, p)
		if err != nil {
			fail(http.StatusForbidden, "FORBIDDEN", err.Error())
			continue
		}
		f, err := os.Open(hp)
		if err != nil {
			fail(http.StatusNotFound, "FILE_NOT_FOUND", "file not found: "+p)
			continue
		}
		fi, err := f.Stat()
		if err != nil || fi.IsDir() {
			f.Close()
			fail(http.StatusBadRequest, "IS_DIRECTORY", "path is a directory: "+p)
			continue
		}
		pw, err := part("file", "application/octet-stream", fi.Size())
		if err == nil {
			_, _ = io.Copy(pw, io.LimitReader(f, fi.Size()))
		}
		f.Close()
	}
	_ = mw.Close()
}

// getSession answers GET /process/session/{id}: the session and its
// commands.
func (s *Server) getSession(w http.ResponseWriter, se *session) {
	s.mu.Lock()
	cmds := []map[string]any{}
	for _, c := range se.cmds {
		cmds = append(cmds, c.record(s.RecordExitCodes))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"sessionId": se.id, "commands": cmds})
}

// followLogs serves …/logs?follow=true over a WebSocket, as the daemon
// does for the SDK's streaming getSessionCommandLogs: the journal from its
// start, markers kept, in binary messages as it grows, then a normal
// close once the command has ended and everything is sent.
func (s *Server) followLogs(w http.ResponseWriter, r *http.Request, cmd *command) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() { // the client may close; reading notices it
		for {
			if _, _, err := conn.Read(ctx); err != nil {
				cancel()
				return
			}
		}
	}()
	sent := 0
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		cmd.mu.Lock()
		chunk := bytes.Clone(cmd.journal[sent:])
		cmd.mu.Unlock()
		ended := false
		select {
		case <-cmd.done:
			ended = true
		default:
		}
		if ended { // anything written before done closed is in the journal
			cmd.mu.Lock()
			chunk = bytes.Clone(cmd.journal[sent:])
			cmd.mu.Unlock()
		}
		for len(chunk) > 0 {
			n := min(len(chunk), 32<<10)
			if err := conn.Write(ctx, websocket.MessageBinary, chunk[:n]); err != nil {
				return
			}
			sent += n
			chunk = chunk[n:]
		}
		if ended {
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-cmd.done:
		}
	}
}

// previewURL answers GET /sandbox/{id}/ports/{port}/preview-url with
// {sandboxId, url, token}: url is the fake's preview proxy for that port,
// which wants the token in X-Daytona-Preview-Token.
func (s *Server) previewURL(w http.ResponseWriter, key, port string) {
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		apiError(w, http.StatusBadRequest, "port must be between 1 and 65535")
		return
	}
	s.mu.Lock()
	sb := s.find(key)
	if sb == nil || s.state(sb) == "destroyed" {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", key))
		return
	}
	if sb.previews == nil {
		sb.previews = map[int]string{}
	}
	tok, ok := sb.previews[n]
	if !ok {
		tok = newID() + newID()
		sb.previews[n] = tok
	}
	id := sb.ID
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"sandboxId": id, "url": fmt.Sprintf("%s/preview/%d-%s", s.ts.URL, n, id), "token": tok})
}

// preview proxies /preview/{port}-{id}/… to the port on loopback (the
// fake's sandboxes share the host's network) for a request carrying the
// port's token.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	host, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/preview/"), "/")
	port, id, _ := strings.Cut(host, "-")
	n, err := strconv.Atoi(port)
	s.mu.Lock()
	sb := s.find(id)
	tok := ""
	if sb != nil && err == nil {
		tok = sb.previews[n]
	}
	started := sb != nil && s.state(sb) == "started"
	s.mu.Unlock()
	if tok == "" || r.Header.Get("X-Daytona-Preview-Token") != tok {
		apiError(w, http.StatusUnauthorized, "preview token is missing or invalid")
		return
	}
	if !started {
		apiError(w, http.StatusBadGateway, "sandbox is not started")
		return
	}
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(n))}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.URL.Path = "/" + rest
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Del("X-Daytona-Preview-Token")
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			apiError(w, http.StatusBadGateway, "no service on port "+port+": "+err.Error())
		},
	}
	rp.ServeHTTP(w, r)
}

// sendInput writes POST …/command/{id}/input's {data} to an async
// command's stdin; a command that has ended, or a sync one, has none (400).
func (s *Server) sendInput(w http.ResponseWriter, r *http.Request, cmd *command) {
	var req struct {
		Data *string `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Data == nil {
		apiError(w, http.StatusBadRequest, "data is required")
		return
	}
	cmd.mu.Lock()
	in := cmd.stdin
	cmd.mu.Unlock()
	select {
	case <-cmd.done:
		in = nil
	default:
	}
	if in == nil {
		apiError(w, http.StatusBadRequest, "command is not running or takes no input")
		return
	}
	// A command that does not read would block the write: bounded.
	_ = in.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(in, *req.Data); err != nil {
		apiError(w, http.StatusBadRequest, "failed to write input: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

// replaceLabels answers PUT /sandbox/{id}/labels {labels} with the
// sandbox's record, its labels replaced.
func (s *Server) replaceLabels(w http.ResponseWriter, r *http.Request, key string) {
	var req struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Labels == nil {
		apiError(w, http.StatusBadRequest, "labels must be an object of strings")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	if sb == nil || s.state(sb) == "destroyed" {
		apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", key))
		return
	}
	sb.Labels = req.Labels
	writeJSON(w, http.StatusOK, map[string]any{"labels": sb.Labels})
}

// setInterval stores POST /sandbox/{id}/{autostop|autoarchive|autodelete}/{minutes},
// shown in the record as autoStopInterval, autoArchiveInterval and
// autoDeleteInterval (the fake does not act on them).
func (s *Server) setInterval(w http.ResponseWriter, key, kind, v string) {
	n, err := strconv.Atoi(v)
	if err != nil || n < -1 || (n < 0 && kind != "autodelete") {
		apiError(w, http.StatusBadRequest, "interval must be a non-negative integer")
		return
	}
	field := map[string]string{"autostop": "autoStopInterval", "autoarchive": "autoArchiveInterval", "autodelete": "autoDeleteInterval"}[kind]
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	if sb == nil || s.state(sb) == "destroyed" {
		apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", key))
		return
	}
	if sb.intervals == nil {
		sb.intervals = map[string]int{}
	}
	sb.intervals[field] = n
	w.WriteHeader(http.StatusOK)
}
