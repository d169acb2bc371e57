package e2btest

import (
	"encoding/json"
	"errors"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxListEntries bounds one ListDir answer.
const maxListEntries = 10000

// sandboxPath is p as envd reports it: absolute, relative paths and ~
// taken from the user's home.
func (sb *sbx) sandboxPath(p string) string {
	home := "/home/" + sb.srv.opts.User
	switch {
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = home + strings.TrimPrefix(p, "~")
	case !path.IsAbs(p):
		p = home + "/" + p
	}
	return path.Clean(p)
}

// entryJSON is filesystem.EntryInfo of the host file host, named by its
// sandbox path sp, in proto3 JSON (int64 as a string, enums by name).
func entryJSON(sp, host string) (map[string]any, error) {
	fi, err := os.Lstat(host)
	if err != nil {
		return nil, err
	}
	typ := "FILE_TYPE_FILE"
	m := map[string]any{}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		typ = "FILE_TYPE_SYMLINK"
		if t, err := os.Readlink(host); err == nil {
			m["symlinkTarget"] = t
		}
	case fi.IsDir():
		typ = "FILE_TYPE_DIRECTORY"
	}
	m["name"] = path.Base(sp)
	m["type"] = typ
	m["path"] = sp
	m["size"] = strconv.FormatInt(fi.Size(), 10)
	m["mode"] = uint32(fi.Mode().Perm())
	m["permissions"] = fi.Mode().String()
	m["modifiedTime"] = fi.ModTime().UTC().Format(time.RFC3339Nano)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m["owner"], m["group"] = userName(st.Uid), groupName(st.Gid)
	}
	return m, nil
}

func userName(uid uint32) string {
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		return u.Username
	}
	return strconv.Itoa(int(uid))
}

func groupName(gid uint32) string {
	if g, err := user.LookupGroupId(strconv.Itoa(int(gid))); err == nil {
		return g.Name
	}
	return strconv.Itoa(int(gid))
}

// unaryRequest decodes a unary Connect JSON request.
func unaryRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		connectError(w, http.StatusUnsupportedMediaType, "unknown", "unsupported content type")
		return false
	}
	if err := json.Unmarshal(readBody(r), v); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return false
	}
	return true
}

// fsError answers a filesystem error as envd does: a missing path is
// not_found, anything else invalid_argument or internal.
func fsError(w http.ResponseWriter, sp string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		connectError(w, http.StatusNotFound, "not_found", "file not found: "+sp)
	case errors.Is(err, fs.ErrPermission):
		connectError(w, http.StatusForbidden, "permission_denied", "permission denied: "+sp)
	default:
		connectError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// envdFS serves filesystem.Filesystem's Stat, MakeDir, Move and Remove.
func (s *Server) envdFS(w http.ResponseWriter, r *http.Request, sb *sbx, method string) {
	var req struct {
		Path        string `json:"path"`
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	if !unaryRequest(w, r, &req) {
		return
	}
	sp := sb.sandboxPath(req.Path)
	host := sb.mapPath(sp)
	switch method {
	case "Stat":
		e, err := entryJSON(sp, host)
		if err != nil {
			fsError(w, sp, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entry": e})
	case "MakeDir":
		if fi, err := os.Lstat(host); err == nil {
			if fi.IsDir() {
				connectError(w, http.StatusConflict, "already_exists", "directory already exists: "+sp)
			} else {
				connectError(w, http.StatusBadRequest, "invalid_argument", "path already exists but it is not a directory: "+sp)
			}
			return
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			fsError(w, sp, err)
			return
		}
		e, err := entryJSON(sp, host)
		if err != nil {
			fsError(w, sp, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entry": e})
	case "Move":
		src, dst := sb.sandboxPath(req.Source), sb.sandboxPath(req.Destination)
		hsrc, hdst := sb.mapPath(src), sb.mapPath(dst)
		if _, err := os.Lstat(hsrc); err != nil {
			fsError(w, src, err)
			return
		}
		if err := os.MkdirAll(filepath.Dir(hdst), 0o755); err != nil {
			fsError(w, dst, err)
			return
		}
		if err := os.Rename(hsrc, hdst); err != nil {
			fsError(w, src, err)
			return
		}
		e, err := entryJSON(dst, hdst)
		if err != nil {
			fsError(w, dst, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entry": e})
	case "Remove":
		if _, err := os.Lstat(host); err != nil {
			fsError(w, sp, err)
			return
		}
		if err := os.RemoveAll(host); err != nil {
			fsError(w, sp, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{})
	}
}

// envdListDir is filesystem.Filesystem/ListDir: the entries below path to
// depth levels (0 or 1: its children), at most maxListEntries.
func (s *Server) envdListDir(w http.ResponseWriter, r *http.Request, sb *sbx) {
	var req struct {
		Path  string `json:"path"`
		Depth uint32 `json:"depth"`
	}
	if !unaryRequest(w, r, &req) {
		return
	}
	if req.Path == "" {
		connectError(w, http.StatusBadRequest, "invalid_argument", "path is required")
		return
	}
	sp := sb.sandboxPath(req.Path)
	host := sb.mapPath(sp)
	fi, err := os.Stat(host)
	if err != nil {
		fsError(w, sp, err)
		return
	}
	if !fi.IsDir() {
		connectError(w, http.StatusBadRequest, "invalid_argument", "path is not a directory: "+sp)
		return
	}
	depth := max(int(req.Depth), 1)
	var entries []map[string]any
	var walk func(sp, host string, level int)
	walk = func(sp, host string, level int) {
		des, err := os.ReadDir(host)
		if err != nil {
			return
		}
		for _, de := range des {
			if len(entries) >= maxListEntries {
				return
			}
			csp, chost := path.Join(sp, de.Name()), filepath.Join(host, de.Name())
			e, err := entryJSON(csp, chost)
			if err != nil {
				continue
			}
			entries = append(entries, e)
			if de.IsDir() && level < depth {
				walk(csp, chost, level+1)
			}
		}
	}
	walk(sp, host, 1)
	if len(entries) == 0 {
		writeJSON(w, http.StatusOK, map[string]any{}) // proto3 JSON omits an empty list
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
}

// inotify's events, as envd's watcher (fsnotify) reports them.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_DELETE_SELF |
	unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB

func eventType(mask uint32) string {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return "EVENT_TYPE_CREATE"
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return "EVENT_TYPE_REMOVE"
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		return "EVENT_TYPE_RENAME"
	case mask&unix.IN_MODIFY != 0:
		return "EVENT_TYPE_WRITE"
	case mask&unix.IN_ATTRIB != 0:
		return "EVENT_TYPE_CHMOD"
	}
	return ""
}

// envdWatchDir is filesystem.Filesystem/WatchDir: a start event, then one
// event per change below path (its children, or every level when
// recursive), named relative to path, with keepalives, until the client
// leaves or the stream's deadline (Connect-Timeout-Ms) passes.
func (s *Server) envdWatchDir(w http.ResponseWriter, r *http.Request, sb *sbx) {
	var req struct {
		Path         string `json:"path"`
		Recursive    bool   `json:"recursive"`
		IncludeEntry bool   `json:"includeEntry"`
	}
	if !readEnvelope(w, r, &req) {
		return
	}
	sw := startStream(w)
	sp := sb.sandboxPath(req.Path)
	host := sb.mapPath(sp)
	if fi, err := os.Stat(host); err != nil {
		sw.fail("not_found", "path not found: "+sp)
		return
	} else if !fi.IsDir() {
		sw.fail("invalid_argument", "path is not a directory: "+sp)
		return
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		sw.fail("internal", "inotify: "+err.Error())
		return
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads wait in the poller, Close ends them
	var mu sync.Mutex
	dirs := map[int]string{} // watch descriptor → its directory, relative to host
	add := func(rel string) {
		wd, err := unix.InotifyAddWatch(fd, filepath.Join(host, rel), watchMask)
		if err == nil {
			mu.Lock()
			dirs[wd] = rel
			mu.Unlock()
		}
	}
	add(".")
	if req.Recursive {
		_ = filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != host {
				rel, _ := filepath.Rel(host, p)
				add(rel)
			}
			return nil
		})
	}
	type fsEvent struct {
		name, typ string
		dir       bool
	}
	events := make(chan fsEvent, 256)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(events)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameLen := int(ev.Len)
				if off+unix.SizeofInotifyEvent+nameLen > n {
					break
				}
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen]), "\x00")
				off += unix.SizeofInotifyEvent + nameLen
				mu.Lock()
				rel, ok := dirs[int(ev.Wd)]
				mu.Unlock()
				typ := eventType(ev.Mask)
				if !ok || typ == "" || (name == "" && ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) == 0) {
					continue
				}
				if name == "" && rel == "." {
					continue // the watched directory itself
				}
				full := path.Join(filepath.ToSlash(rel), name)
				select {
				case events <- fsEvent{name: full, typ: typ, dir: ev.Mask&unix.IN_ISDIR != 0}:
				case <-done:
					return
				}
			}
		}
	}()
	defer func() {
		close(done)
		f.Close()
		wg.Wait()
	}()
	if !sw.write(0, []byte(`{"start":{}}`)) {
		return
	}
	ka := s.opts.Second * 50
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		ka = s.secs(v)
	}
	tick := time.NewTicker(ka)
	defer tick.Stop()
	var deadline <-chan time.Time
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case <-deadline:
			sw.fail("deadline_exceeded", "context deadline exceeded")
			return
		case <-tick.C:
			if !sw.write(0, []byte(`{"keepalive":{}}`)) {
				return
			}
		case ev, ok := <-events:
			if !ok {
				sw.fail("internal", "watcher closed")
				return
			}
			if req.Recursive && ev.dir && ev.typ == "EVENT_TYPE_CREATE" {
				add(ev.name)
			}
			fe := map[string]any{"name": ev.name, "type": ev.typ}
			if req.IncludeEntry {
				if e, err := entryJSON(path.Join(sp, ev.name), filepath.Join(host, ev.name)); err == nil {
					fe["entry"] = e
				}
			}
			b, _ := json.Marshal(map[string]any{"filesystem": fe})
			if !sw.write(0, b) {
				return
			}
		}
	}
}
