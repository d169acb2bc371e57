package daytonadoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// The toolbox's file routes run as short shell commands in the sandbox
// through /v1's exec, and uploads and downloads through /v1's files API:
// never a host-side file operation. Exit 44 is "no such path", 46 "a
// directory without recursive", 47 "not a directory".
const statLine = `stat -c '%F|%s|%a|%U|%G|%Y|%n' -- "$1"`

var fsScripts = map[string]string{
	"list": `[ -e "$1" ] || exit 44; [ -d "$1" ] || exit 47; for f in "$1"/* "$1"/.*; do [ -e "$f" ] || continue; ` +
		`case ${f##*/} in .|..) continue;; esac; stat -c '%F|%s|%a|%U|%G|%Y|%n' -- "$f"; done`,
	"info":   `[ -e "$1" ] || exit 44; ` + statLine,
	"folder": `mkdir -p -m "$2" -- "$1"`,
	"delete": `[ -e "$1" ] || [ -L "$1" ] || exit 44; if [ -d "$1" ] && [ "$2" != true ]; then exit 46; fi; rm -rf -- "$1"`,
	"move":   `[ -e "$1" ] || exit 44; mv -- "$1" "$2"`,
	"mkdirp": `mkdir -p -- "$(dirname -- "$1")"`,
	"search": `[ -e "$1" ] || exit 44; find "$1" -name "$2" -print`,
	"find":   `[ -e "$1" ] || exit 44; grep -rnaFZ -e "$2" -- "$1"; [ $? -le 1 ]`,
}

// maxUpload bounds one uploaded file (the platform's own bounds apply too).
const maxUpload = 64 << 20

// run runs one of fsScripts with args.
func run(r *http.Request, p *client.Client, h *sandbox.Handle, script string, args ...string) (sandbox.ExecResult, error) {
	return p.Exec(r.Context(), h, sandbox.Cmd{Name: "sh", Args: append([]string{"-c", fsScripts[script], "sh"}, args...)}, sandbox.ExecOptions{Timeout: time.Minute})
}

// home is the sandbox's working directory, which relative paths start from.
func (d *Door) home(r *http.Request, p *client.Client, key string, h *sandbox.Handle) (string, error) {
	d.mu.Lock()
	if m := d.meta[metaKey(key, h.Name)]; m != nil && m.Home != "" {
		d.mu.Unlock()
		return m.Home, nil
	}
	d.mu.Unlock()
	res, err := p.Exec(r.Context(), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "pwd"}}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(res.Output))
	if res.ExitCode != 0 || !strings.HasPrefix(dir, "/") {
		return "", fmt.Errorf("no working directory: %q", res.Output)
	}
	d.mu.Lock()
	d.metaLocked(key, h.Name).Home = dir
	d.mu.Unlock()
	return dir, nil
}

// abs is p from the sandbox's working directory.
func (d *Door) abs(r *http.Request, pc *client.Client, key string, h *sandbox.Handle, p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	home, err := d.home(r, pc, key, h)
	if err != nil {
		return "", err
	}
	return path.Join(home, p), nil
}

// fileInfo is a stat line in the toolbox's FileInfo shape.
func fileInfo(line string) (map[string]any, bool) {
	f := strings.SplitN(line, "|", 7)
	if len(f) != 7 {
		return nil, false
	}
	size, _ := strconv.ParseInt(f[1], 10, 64)
	perm, _ := strconv.ParseUint(f[2], 8, 32)
	sec, _ := strconv.ParseInt(f[5], 10, 64)
	mt := time.Unix(sec, 0).UTC().Format(time.RFC3339)
	isDir := f[0] == "directory"
	mode := "-"
	if isDir {
		mode = "d"
	}
	for i := 8; i >= 0; i-- {
		if perm&(1<<i) != 0 {
			mode += string("xwr"[i%3])
		} else {
			mode += "-"
		}
	}
	return map[string]any{"name": path.Base(f[6]), "path": f[6], "isDir": isDir, "size": size, "mode": mode,
		"permissions": fmt.Sprintf("%#o", perm), "modTime": mt, "modifiedAt": mt, "owner": f[3], "group": f[4]}, true
}

// files serves the toolbox's file routes; false when sub is none of them.
func (d *Door) files(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle, sub string) bool {
	q := r.URL.Query()
	// pathOf is a query parameter from the working directory; "" when it
	// answered.
	pathOf := func(name string) string {
		v := q.Get(name)
		if v == "" {
			apiErr(w, http.StatusBadRequest, name+" is required")
			return ""
		}
		a, err := d.abs(r, p, key, h, v)
		if err != nil {
			fail(w, err, notFoundMsg(h.Name))
			return ""
		}
		return a
	}
	// done answers an exec's result by its exit code.
	done := func(res sandbox.ExecResult, err error, ok func()) {
		switch {
		case err != nil:
			fail(w, err, notFoundMsg(h.Name))
		case res.ExitCode == 44:
			apiErr(w, http.StatusNotFound, "file not found")
		case res.ExitCode == 46:
			apiErr(w, http.StatusBadRequest, "cannot delete directory without recursive flag")
		case res.ExitCode == 47:
			apiErr(w, http.StatusBadRequest, "path is not a directory")
		case res.ExitCode != 0:
			apiErr(w, http.StatusBadRequest, strings.TrimSpace(string(res.Output)))
		default:
			ok()
		}
	}
	switch {
	case sub == "/files" && r.Method == http.MethodGet:
		if q.Get("path") == "" {
			q.Set("path", ".")
		}
		a := pathOf("path")
		if a == "" {
			return true
		}
		res, err := run(r, p, h, "list", a)
		done(res, err, func() {
			out := []map[string]any{}
			for _, l := range strings.Split(strings.TrimSpace(string(res.Output)), "\n") {
				if fi, ok := fileInfo(l); ok {
					out = append(out, fi)
				}
			}
			writeJSON(w, http.StatusOK, out)
		})
	case sub == "/files/info" && r.Method == http.MethodGet:
		if a := pathOf("path"); a != "" {
			res, err := run(r, p, h, "info", a)
			done(res, err, func() {
				fi, ok := fileInfo(strings.TrimSpace(string(res.Output)))
				if !ok {
					apiErr(w, http.StatusBadGateway, "unreadable stat")
					return
				}
				writeJSON(w, http.StatusOK, fi)
			})
		}
	case sub == "/files" && r.Method == http.MethodDelete:
		if a := pathOf("path"); a != "" {
			res, err := run(r, p, h, "delete", a, q.Get("recursive"))
			done(res, err, func() { w.WriteHeader(http.StatusNoContent) })
		}
	case sub == "/files/folder" && r.Method == http.MethodPost:
		mode := q.Get("mode")
		if mode == "" {
			mode = "755"
		}
		if v, err := strconv.ParseUint(mode, 8, 32); err != nil || v > 0o7777 {
			apiErr(w, http.StatusBadRequest, "invalid mode format")
			return true
		}
		if a := pathOf("path"); a != "" {
			res, err := run(r, p, h, "folder", a, mode)
			done(res, err, func() { w.WriteHeader(http.StatusCreated) })
		}
	case sub == "/files/move" && r.Method == http.MethodPost:
		src := pathOf("source")
		if src == "" {
			return true
		}
		if dst := pathOf("destination"); dst != "" {
			res, err := run(r, p, h, "move", src, dst)
			done(res, err, func() { w.WriteHeader(http.StatusOK) })
		}
	case (sub == "/files/upload-v2" || sub == "/files/upload") && r.Method == http.MethodPost:
		a := pathOf("path")
		if a == "" {
			return true
		}
		f, _, err := r.FormFile("file")
		if err != nil {
			apiErr(w, http.StatusBadRequest, "multipart field file is required")
			return true
		}
		defer f.Close()
		if d.put(w, r, p, h, a, f) {
			w.WriteHeader(http.StatusOK)
		}
	case sub == "/files/search" && r.Method == http.MethodGet:
		pat := q.Get("pattern")
		if pat == "" {
			apiErr(w, http.StatusBadRequest, "invalid pattern")
			return true
		}
		if a := pathOf("path"); a != "" {
			res, err := run(r, p, h, "search", a, pat)
			done(res, err, func() {
				files := []string{}
				for _, l := range strings.Split(string(res.Output), "\n") {
					if l != "" {
						files = append(files, l)
					}
				}
				writeJSON(w, http.StatusOK, map[string]any{"files": files})
			})
		}
	case sub == "/files/find" && r.Method == http.MethodGet:
		pat := q.Get("pattern")
		if pat == "" {
			apiErr(w, http.StatusBadRequest, "pattern is required")
			return true
		}
		if a := pathOf("path"); a != "" {
			res, err := run(r, p, h, "find", a, pat)
			done(res, err, func() {
				out := []map[string]any{}
				for _, l := range strings.Split(string(res.Output), "\n") {
					file, rest, ok := strings.Cut(l, "\x00")
					if !ok {
						continue
					}
					num, content, _ := strings.Cut(rest, ":")
					n, _ := strconv.Atoi(num)
					out = append(out, map[string]any{"file": file, "line": n, "content": content})
				}
				writeJSON(w, http.StatusOK, out)
			})
		}
	case sub == "/files/replace" && r.Method == http.MethodPost:
		d.replace(w, r, p, key, h)
	case sub == "/files/bulk-upload" && r.Method == http.MethodPost:
		d.bulkUpload(w, r, p, key, h)
	case sub == "/files/bulk-download" && r.Method == http.MethodPost:
		d.bulkDownload(w, r, p, key, h)
	default:
		return false
	}
	return true
}

// put writes body to the absolute path a in the sandbox, making its
// directory; false when it answered an error.
func (d *Door) put(w http.ResponseWriter, r *http.Request, p *client.Client, h *sandbox.Handle, a string, body io.Reader) bool {
	res, err := run(r, p, h, "mkdirp", a)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("mkdir: %s", bytes.TrimSpace(res.Output))
	}
	if err == nil {
		err = p.WriteFileFrom(r.Context(), h, a, body, sandbox.WriteFileOptions{})
	}
	if err != nil {
		fail(w, err, "file not found")
		return false
	}
	return true
}

var bulkField = regexp.MustCompile(`^files\[(\d{1,6})\]\.(path|file)$`)

// bulkUpload takes multipart fields files[i].path then files[i].file, in
// that order, as the SDK sends them.
func (d *Door) bulkUpload(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle) {
	mr, err := r.MultipartReader()
	if err != nil {
		apiErr(w, http.StatusBadRequest, "multipart body is required")
		return
	}
	paths := map[string]string{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(w, err, "")
			return
		}
		m := bulkField.FindStringSubmatch(part.FormName())
		if m == nil {
			_ = part.Close()
			continue
		}
		if m[2] == "path" {
			b, err := io.ReadAll(io.LimitReader(part, 4097))
			if err != nil || len(b) > 4096 || len(b) == 0 {
				apiErr(w, http.StatusBadRequest, "bad path field")
				return
			}
			paths[m[1]] = string(b)
			continue
		}
		dst, ok := paths[m[1]]
		if !ok {
			apiErr(w, http.StatusBadRequest, fmt.Sprintf("files[%s].path must come before its file", m[1]))
			return
		}
		a, err := d.abs(r, p, key, h, dst)
		if err != nil {
			fail(w, err, notFoundMsg(h.Name))
			return
		}
		if !d.put(w, r, p, h, a, part) {
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// bulkDownload answers a multipart body: a "file" part per path, or an
// "error" part with JSON {message, statusCode, code}.
func (d *Door) bulkDownload(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle) {
	var req struct {
		Paths []string `json:"paths"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Paths) == 0 || len(req.Paths) > 1000 {
		apiErr(w, http.StatusBadRequest, "paths are required")
		return
	}
	mw := multipart.NewWriter(w)
	w.Header().Set("Content-Type", "multipart/form-data; boundary="+mw.Boundary())
	w.WriteHeader(http.StatusOK)
	for _, name := range req.Paths {
		part := func(field, ctype string) (io.Writer, error) {
			hd := textproto.MIMEHeader{}
			hd.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, field, name))
			hd.Set("Content-Type", ctype)
			return mw.CreatePart(hd)
		}
		failPart := func(status int, code, msg string) {
			b, _ := json.Marshal(map[string]any{"message": msg, "statusCode": status, "code": code})
			if pw, err := part("error", "application/json"); err == nil {
				_, _ = pw.Write(b)
			}
		}
		a, err := d.abs(r, p, key, h, name)
		if err != nil {
			failPart(http.StatusBadGateway, "UNAVAILABLE", err.Error())
			continue
		}
		rc, _, err := p.OpenFile(r.Context(), h, a)
		if err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				failPart(http.StatusNotFound, "FILE_NOT_FOUND", "file not found: "+name)
			} else {
				failPart(http.StatusBadRequest, "READ_FAILED", err.Error())
			}
			continue
		}
		pw, err := part("file", "application/octet-stream")
		if err == nil {
			_, _ = io.Copy(pw, rc)
		}
		rc.Close()
	}
	_ = mw.Close()
}

// maxReplace bounds a file replaceInFiles reads.
const maxReplace = 16 << 20

// replace applies a regular expression to each file, read and written
// through /v1's files API.
func (d *Door) replace(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle) {
	var req struct {
		Files    []string `json:"files"`
		Pattern  string   `json:"pattern"`
		NewValue *string  `json:"newValue"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Pattern == "" || req.NewValue == nil || len(req.Files) > 1000 {
		apiErr(w, http.StatusBadRequest, "files, pattern and newValue are required")
		return
	}
	re, err := regexp.Compile(req.Pattern)
	if err != nil {
		apiErr(w, http.StatusBadRequest, "invalid pattern: "+err.Error())
		return
	}
	out := []map[string]any{}
	for _, f := range req.Files {
		a, err := d.abs(r, p, key, h, f)
		var data []byte
		if err == nil {
			var rc io.ReadCloser
			if rc, _, err = p.OpenFile(r.Context(), h, a); err == nil {
				data, err = io.ReadAll(io.LimitReader(rc, maxReplace+1))
				rc.Close()
				if err == nil && len(data) > maxReplace {
					err = fmt.Errorf("file larger than %d bytes", maxReplace)
				}
			}
		}
		if err == nil {
			err = p.WriteFile(r.Context(), h, a, re.ReplaceAll(data, []byte(*req.NewValue)), sandbox.WriteFileOptions{})
		}
		res := map[string]any{"file": f, "success": err == nil}
		if err != nil {
			res["error"] = err.Error()
		}
		out = append(out, res)
	}
	writeJSON(w, http.StatusOK, out)
}
