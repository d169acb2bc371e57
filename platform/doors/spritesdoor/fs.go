package spritesdoor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// The filesystem calls other than read and write run as one short shell
// command each in the sandbox, through /v1's exec: the platform has no
// such operations of its own. Their exit codes name the errno.
var exitErrno = map[int]struct {
	code   string
	status int
	text   string
}{
	44: {"ENOENT", http.StatusNotFound, "no such file or directory"},
	45: {"EEXIST", http.StatusConflict, "file exists"},
	46: {"ENOTEMPTY", http.StatusConflict, "directory not empty"},
	47: {"EISDIR", http.StatusBadRequest, "is a directory"},
	48: {"ENOTDIR", http.StatusBadRequest, "not a directory"},
	49: {"EINVAL", http.StatusBadRequest, "invalid argument"},
}

// fsErr answers the filesystem API's error shape, {error, code, path}.
func fsErr(w http.ResponseWriter, status int, code, msg, p string) {
	writeJSON(w, status, map[string]any{"error": msg, "code": code, "path": p})
}

// resolve is the sprite path p, relative to wd.
func resolve(p, wd string) string {
	if wd == "" {
		wd = "/"
	}
	if !strings.HasPrefix(p, "/") {
		p = wd + "/" + p
	}
	return path.Clean("/" + p)
}

// sh runs script in the sandbox with args; its output (stdout and
// stderr) is bounded by max.
func (c *call) sh(ctx context.Context, script string, max int, args ...string) (sandbox.ExecResult, error) {
	return c.p.Exec(ctx, c.h, sandbox.Cmd{Name: "/bin/sh", Args: append([]string{"-c", script, "sh"}, args...)},
		sandbox.ExecOptions{MaxOutput: max, Timeout: time.Minute, StderrToStdout: true})
}

// shFail answers a script's failure: its errno exit code, or EIO.
func shFail(w http.ResponseWriter, r sandbox.ExecResult, op, p string) {
	if e, ok := exitErrno[r.ExitCode]; ok {
		fsErr(w, e.status, e.code, fmt.Sprintf("%s: %s, %s '%s'", e.code, e.text, op, p), p)
		return
	}
	fsErr(w, http.StatusInternalServerError, "EIO", op+" failed: "+strings.TrimSpace(string(r.Output)), p)
}

const listScript = `[ -e "$1" ] || [ -L "$1" ] || exit 44
if [ -d "$1" ] && [ ! -L "$1" ]; then
  if [ "$2" = true ]; then d=; else d="-maxdepth 1"; fi
  if [ -n "$3" ]; then find "$1" -mindepth 1 $d -name "$3" -printf '%y|%s|%m|%T@|%P|%p\0'
  else find "$1" -mindepth 1 $d -printf '%y|%s|%m|%T@|%P|%p\0'; fi
else find "$1" -maxdepth 0 -printf '%y|%s|%m|%T@|%f|%p\0'; fi`

const deleteScript = `[ -e "$1" ] || [ -L "$1" ] || exit 44
if [ -d "$1" ] && [ ! -L "$1" ]; then
  if [ "$2" = true ]; then rm -rf -- "$1"; else [ -z "$(ls -A -- "$1")" ] || exit 46; rmdir -- "$1"; fi
else rm -f -- "$1"; fi`

const renameScript = `[ -e "$1" ] || [ -L "$1" ] || exit 44; mv -f -- "$1" "$2"`

const copyScript = `[ -e "$1" ] || exit 44
if [ -d "$1" ] && [ "$3" != true ]; then exit 47; fi
if [ "$4" = true ]; then cp -a -- "$1" "$2"; else cp -R -- "$1" "$2"; fi`

const chmodScript = `[ -e "$1" ] || exit 44; if [ "$3" = true ]; then chmod -R "$2" -- "$1"; else chmod "$2" -- "$1"; fi`

const chownScript = `[ -e "$1" ] || exit 44; if [ "$3" = true ]; then chown -R -- "$2" "$1"; else chown -- "$2" "$1"; fi`

// filesystem serves fs/{op}.
func (c *call) filesystem(w http.ResponseWriter, r *http.Request, op string) {
	q := r.URL.Query()
	wd := q.Get("workingDir")
	switch {
	case op == "write" && r.Method == http.MethodPut:
		c.writeFile(w, r, q.Get("path"), wd, q.Get("mode"), q.Get("mkdirParents") == "true")
	case op == "read" && r.Method == http.MethodGet:
		c.readFile(w, r, q.Get("path"), wd)
	case op == "list" && r.Method == http.MethodGet:
		c.listDir(w, r, q.Get("path"), wd, q.Get("recursive") == "true", q.Get("pattern"))
	case op == "delete" && r.Method == http.MethodDelete:
		p := q.Get("path")
		if p == "" {
			apiErr(w, http.StatusBadRequest, "invalid_request", "path is required")
			return
		}
		full := resolve(p, wd)
		if full == "/" {
			fsErr(w, http.StatusBadRequest, "EINVAL", "EINVAL: invalid argument, rm '"+p+"'", p)
			return
		}
		res, err := c.sh(r.Context(), deleteScript, 8<<10, full, strconv.FormatBool(q.Get("recursive") == "true"))
		if err != nil {
			fail(w, err, "sprite not found")
			return
		}
		if res.ExitCode != 0 {
			shFail(w, res, "rm", p)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"deleted": []string{full}})
	case (op == "rename" || op == "copy" || op == "chmod" || op == "chown") && r.Method == http.MethodPost:
		c.fsJSON(w, r, op)
	default:
		apiErr(w, http.StatusNotFound, "not_found", "no such route")
	}
}

func (c *call) fsJSON(w http.ResponseWriter, r *http.Request, op string) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Source        string `json:"source"`
		Dest          string `json:"dest"`
		Path          string `json:"path"`
		WorkingDir    string `json:"workingDir"`
		Mode          string `json:"mode"`
		Recursive     bool   `json:"recursive"`
		PreserveAttrs bool   `json:"preserveAttrs"`
		UID           any    `json:"uid"`
		GID           any    `json:"gid"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid_request", "invalid JSON body")
		return
	}
	var res sandbox.ExecResult
	var err error
	var out map[string]any
	shown := req.Path
	switch op {
	case "rename", "copy":
		if req.Source == "" || req.Dest == "" {
			apiErr(w, http.StatusBadRequest, "invalid_request", "source and dest are required")
			return
		}
		shown = req.Source
		src, dst := resolve(req.Source, req.WorkingDir), resolve(req.Dest, req.WorkingDir)
		if op == "rename" {
			res, err = c.sh(r.Context(), renameScript, 8<<10, src, dst)
		} else {
			res, err = c.sh(r.Context(), copyScript, 8<<10, src, dst, strconv.FormatBool(req.Recursive), strconv.FormatBool(req.PreserveAttrs))
		}
		out = map[string]any{"source": src, "dest": dst}
	case "chmod":
		m, perr := strconv.ParseUint(req.Mode, 8, 32)
		if req.Path == "" || perr != nil || m > 0o7777 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "path and an octal mode are required")
			return
		}
		full := resolve(req.Path, req.WorkingDir)
		mode := fmt.Sprintf("%04o", m)
		res, err = c.sh(r.Context(), chmodScript, 8<<10, full, mode, strconv.FormatBool(req.Recursive))
		out = map[string]any{"path": full, "mode": mode}
	case "chown":
		owner, ok := ownerOf(req.UID, req.GID)
		if req.Path == "" || !ok {
			apiErr(w, http.StatusBadRequest, "invalid_request", "path and a uid or gid are required")
			return
		}
		full := resolve(req.Path, req.WorkingDir)
		res, err = c.sh(r.Context(), chownScript, 8<<10, full, owner, strconv.FormatBool(req.Recursive))
		out = map[string]any{"path": full}
	}
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	if res.ExitCode != 0 {
		shFail(w, res, op, shown)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// ownerOf is chown's owner argument from a uid and gid (numbers or
// names), refused when it could be read as an option or a path.
func ownerOf(uid, gid any) (string, bool) {
	part := func(v any) (string, bool) {
		switch x := v.(type) {
		case nil:
			return "", true
		case float64:
			if x < 0 || x != float64(int64(x)) {
				return "", false
			}
			return strconv.FormatInt(int64(x), 10), true
		case string:
			for _, r := range x {
				if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
					return "", false
				}
			}
			return x, x == "" || x[0] != '-'
		}
		return "", false
	}
	u, ok1 := part(uid)
	g, ok2 := part(gid)
	if !ok1 || !ok2 || (u == "" && g == "") {
		return "", false
	}
	if g == "" {
		return u, true
	}
	return u + ":" + g, true
}

// countReader counts what is read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *call) writeFile(w http.ResponseWriter, r *http.Request, p, wd, modeArg string, parents bool) {
	if p == "" {
		apiErr(w, http.StatusBadRequest, "invalid_request", "path is required")
		return
	}
	mode := uint64(0o644)
	if modeArg != "" {
		m, err := strconv.ParseUint(modeArg, 8, 32)
		if err != nil || m > 0o7777 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "mode must be octal")
			return
		}
		mode = m
	}
	full := resolve(p, wd)
	if parents {
		res, err := c.sh(r.Context(), `mkdir -p -- "$1"`, 8<<10, path.Dir(full))
		if err != nil {
			fail(w, err, "sprite not found")
			return
		}
		if res.ExitCode != 0 {
			fsErr(w, http.StatusBadRequest, "ENOTDIR", "ENOTDIR: cannot make the parent directories, write '"+p+"'", p)
			return
		}
	}
	cr := &countReader{r: r.Body}
	if err := c.p.WriteFileFrom(r.Context(), c.h, full, cr, sandbox.WriteFileOptions{Mode: fsMode(mode)}); err != nil {
		st, code, msg := statusOf(err)
		if st == http.StatusNotFound {
			fsErr(w, st, "ENOENT", "ENOENT: no such file or directory, write '"+p+"'", p)
			return
		}
		apiErr(w, st, code, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": full, "size": cr.n, "mode": fmt.Sprintf("%o", mode)})
}

func (c *call) readFile(w http.ResponseWriter, r *http.Request, p, wd string) {
	if p == "" {
		apiErr(w, http.StatusBadRequest, "invalid_request", "path is required")
		return
	}
	full := resolve(p, wd)
	rc, n, err := c.p.OpenFile(r.Context(), c.h, full)
	if err != nil {
		st, code, msg := statusOf(err)
		var iv *sandbox.InvalidError
		switch {
		case st == http.StatusNotFound:
			fsErr(w, st, "ENOENT", "ENOENT: no such file or directory, read '"+p+"'", p)
		case errors.As(err, &iv):
			fsErr(w, st, "EISDIR", "EISDIR: "+msg+", read '"+p+"'", p)
		default:
			apiErr(w, st, code, msg)
		}
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if n >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	}
	_, _ = io.Copy(w, rc)
}

// listDir answers {path, entries}: a directory's entries (every level
// below with recursive, names matching the glob pattern when given), or a
// file's own entry; find(1) in the sandbox, its output bounded at 4 MiB
// (a listing past it is 507, never a partial one that looks whole).
func (c *call) listDir(w http.ResponseWriter, r *http.Request, p, wd string, recursive bool, pattern string) {
	if p == "" {
		p = "."
	}
	full := resolve(p, wd)
	// stdout alone: a find(1) complaint on stderr never mixes into the
	// records.
	res, err := c.p.Exec(r.Context(), c.h, sandbox.Cmd{Name: "/bin/sh", Args: []string{"-c", listScript, "sh", full, strconv.FormatBool(recursive), pattern}},
		sandbox.ExecOptions{MaxOutput: 4 << 20, Timeout: time.Minute})
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	switch {
	case res.ExitCode != 0:
		shFail(w, res, "readdir", p)
		return
	case res.Truncated:
		fsErr(w, http.StatusInsufficientStorage, "EIO", "the listing is over 4 MiB", p)
		return
	}
	entries := []map[string]any{}
	for _, rec := range strings.Split(string(res.Output), "\x00") {
		f := strings.SplitN(rec, "|", 6)
		if len(f) != 6 {
			continue
		}
		size, _ := strconv.ParseInt(f[1], 10, 64)
		m, _ := strconv.ParseUint(f[2], 8, 32)
		sec, _ := strconv.ParseFloat(f[3], 64)
		typ := "file"
		switch f[0] {
		case "d":
			typ = "directory"
		case "l":
			typ = "symlink"
		}
		entries = append(entries, map[string]any{"name": f[4], "path": f[5], "size": size, "mode": fmt.Sprintf("%04o", m),
			"modTime": time.Unix(0, int64(sec*1e9)).UTC().Format(time.RFC3339Nano), "isDir": f[0] == "d", "type": typ})
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": full, "entries": entries})
}

func fsMode(m uint64) fs.FileMode { return fs.FileMode(m) }
