package daytonadoor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "d" + hex.EncodeToString(b[:])
}

func notFoundMsg(id string) string { return "Sandbox with ID or name " + id + " not found" }

// stateOf is the Daytona state of a platform record.
func stateOf(s api.Sandbox) string {
	switch s.State {
	case "running":
		return "started"
	case "creating":
		return "creating"
	case "suspended", "parked", "parking":
		return "stopped"
	}
	return "unknown"
}

// record is a platform sandbox in Daytona's shape.
func (d *Door) record(r *http.Request, key string, s api.Sandbox) map[string]any {
	d.mu.Lock()
	labels := map[string]string{}
	if m := d.meta[metaKey(key, s.Name)]; m != nil {
		for k, v := range m.Labels {
			labels[k] = v
		}
	}
	d.mu.Unlock()
	state := stateOf(s)
	desired := "started"
	if state == "stopped" {
		desired = "stopped"
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return map[string]any{"id": s.Name, "name": s.Name, "organizationId": "managoat", "user": "daytona", "target": "managoat",
		"state": state, "desiredState": desired, "labels": labels, "env": map[string]string{}, "public": false,
		"cpu": 1, "gpu": 0, "memory": 1, "disk": 1, "createdAt": s.CreatedAt.UTC().Format(time.RFC3339Nano),
		"updatedAt":       s.LastActivity.UTC().Format(time.RFC3339Nano),
		"toolboxProxyUrl": scheme + "://" + r.Host + d.prefix + "/toolbox"}
}

func (d *Door) controlPlane(w http.ResponseWriter, r *http.Request, p *client.Client, key, rest string) {
	var parts []string
	if rest != "" {
		parts = strings.Split(rest, "/")
	}
	switch {
	case len(parts) == 0 && r.Method == http.MethodPost:
		d.create(w, r, p, key)
		return
	case len(parts) == 0 && r.Method == http.MethodGet:
		d.list(w, r, p, key)
		return
	case len(parts) == 1 && r.Method == http.MethodGet && (parts[0] == "paginated" || parts[0] == "for-runner"):
		notSupported(w, "/sandbox/"+parts[0])
		return
	}
	id := parts[0]
	if sandbox.ValidateName(id) != nil {
		apiErr(w, http.StatusNotFound, notFoundMsg(id))
		return
	}
	h := &sandbox.Handle{Provider: client.Name, Name: id}
	s, err := p.Lookup(r.Context(), h)
	if err != nil {
		fail(w, err, notFoundMsg(id))
		return
	}
	action := strings.Join(parts[1:], "/")
	switch {
	case action == "" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, d.record(r, key, s))
	case action == "" && r.Method == http.MethodDelete:
		if err := p.Destroy(r.Context(), h); err != nil {
			fail(w, err, notFoundMsg(id))
			return
		}
		d.mu.Lock()
		delete(d.meta, metaKey(key, id))
		d.mu.Unlock()
		rec := d.record(r, key, s)
		rec["state"], rec["desiredState"] = "destroyed", "destroyed"
		writeJSON(w, http.StatusOK, rec)
	case action == "stop" && r.Method == http.MethodPost:
		if stateOf(s) != "stopped" {
			if err := p.Suspend(r.Context(), h); err != nil {
				fail(w, err, notFoundMsg(id))
				return
			}
		}
		d.answer(w, r, p, key, h)
	case action == "start" && r.Method == http.MethodPost:
		if stateOf(s) != "started" {
			if _, err := p.Resume(r.Context(), h); err != nil {
				fail(w, err, notFoundMsg(id))
				return
			}
		}
		d.answer(w, r, p, key, h)
	case action == "labels" && r.Method == http.MethodPut:
		var req struct {
			Labels map[string]string `json:"labels"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			apiErr(w, http.StatusBadRequest, "invalid JSON body")
			return
		}
		if len(req.Labels) > 64 {
			apiErr(w, http.StatusBadRequest, "too many labels")
			return
		}
		d.mu.Lock()
		m := d.metaLocked(key, id)
		m.Labels = req.Labels
		d.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"labels": req.Labels})
	case action == "toolbox-proxy-url" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"url": d.record(r, key, s)["toolboxProxyUrl"]})
	default:
		notSupported(w, r.Method+" /sandbox/{id}/"+action)
	}
}

// metaLocked is the door's record of name, made if missing; d.mu held.
func (d *Door) metaLocked(key, name string) *meta {
	m := d.meta[metaKey(key, name)]
	if m == nil {
		m = &meta{Labels: map[string]string{}}
		d.meta[metaKey(key, name)] = m
	}
	return m
}

// answer writes the sandbox's record as it is now.
func (d *Door) answer(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle) {
	s, err := p.Lookup(r.Context(), h)
	if err != nil {
		fail(w, err, notFoundMsg(h.Name))
		return
	}
	writeJSON(w, http.StatusOK, d.record(r, key, s))
}

func (d *Door) create(w http.ResponseWriter, r *http.Request, p *client.Client, key string) {
	var req struct {
		Name     string            `json:"name"`
		Labels   map[string]string `json:"labels"`
		EnvVars  map[string]string `json:"env"`
		Snapshot string            `json:"snapshot"`
		Volumes  []json.RawMessage `json:"volumes"`
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		fail(w, err, "")
		return
	}
	if err := json.Unmarshal(body, &req); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid JSON body")
		return
	}
	if req.Snapshot != "" {
		apiErr(w, http.StatusBadRequest, fmt.Sprintf("Snapshot %s not found: snapshots are not supported by managoat's Daytona front door", req.Snapshot))
		return
	}
	if len(req.Volumes) > 0 {
		notSupported(w, "volumes")
		return
	}
	if len(req.Labels) > 64 || len(req.EnvVars) > 256 {
		apiErr(w, http.StatusBadRequest, "too many labels or env entries")
		return
	}
	name := req.Name
	if name == "" {
		name = newID()
	} else if err := sandbox.ValidateName(name); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid sandbox name: "+err.Error())
		return
	}
	h, err := p.CreateNew(r.Context(), name, sandbox.CreateNewOptions{})
	if err != nil {
		if errors.Is(err, sandbox.ErrAlreadyExists) {
			apiErr(w, http.StatusConflict, "Sandbox with name "+name+" already exists")
			return
		}
		fail(w, err, notFoundMsg(name))
		return
	}
	d.mu.Lock()
	m := d.metaLocked(key, name)
	if req.Labels != nil {
		m.Labels = req.Labels
	}
	m.Envs = req.EnvVars
	d.mu.Unlock()
	d.answer(w, r, p, key, h)
}

func (d *Door) list(w http.ResponseWriter, r *http.Request, p *client.Client, key string) {
	want := map[string]string{}
	if l := r.URL.Query().Get("labels"); l != "" {
		if err := json.Unmarshal([]byte(l), &want); err != nil {
			apiErr(w, http.StatusBadRequest, "labels must be a JSON object")
			return
		}
	}
	all, err := p.List(r.Context())
	if err != nil {
		fail(w, err, "")
		return
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	items := []map[string]any{}
	for _, s := range all {
		rec := d.record(r, key, s)
		labels := rec["labels"].(map[string]string)
		ok := true
		for k, v := range want {
			if labels[k] != v {
				ok = false
			}
		}
		if ok {
			items = append(items, rec)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items, "nextCursor": nil, "total": len(items), "page": 1, "totalPages": 1})
}

// toolbox is the in-sandbox API.
func (d *Door) toolbox(w http.ResponseWriter, r *http.Request, p *client.Client, key, id, sub string) {
	if sandbox.ValidateName(id) != nil {
		apiErr(w, http.StatusNotFound, notFoundMsg(id))
		return
	}
	h := &sandbox.Handle{Provider: client.Name, Name: id}
	s, err := p.Lookup(r.Context(), h)
	if err != nil {
		fail(w, err, notFoundMsg(id))
		return
	}
	if stateOf(s) != "started" {
		apiErr(w, http.StatusBadRequest, "failed to reach the toolbox. Is the Sandbox started?")
		return
	}
	switch {
	case sub == "/process/execute" && r.Method == http.MethodPost:
		d.execute(w, r, p, key, h)
	case (sub == "/user-home-dir" || sub == "/work-dir") && r.Method == http.MethodGet:
		res, err := p.Exec(r.Context(), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "pwd"}}, sandbox.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			fail(w, err, notFoundMsg(id))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"dir": strings.TrimSpace(string(res.Output))})
	case d.files(w, r, p, key, h, sub):
	case strings.HasPrefix(sub, "/lsp") || strings.HasPrefix(sub, "/git") || strings.HasPrefix(sub, "/computeruse") ||
		strings.HasPrefix(sub, "/process/pty") || strings.HasPrefix(sub, "/process/session") || strings.HasPrefix(sub, "/files") ||
		strings.HasPrefix(sub, "/process/code-run") || strings.HasPrefix(sub, "/process/interpreter"):
		notSupported(w, "the toolbox's "+sub)
	default:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "404 page not found")
	}
}

func (d *Door) envs(key, name string, extra map[string]string) []string {
	env := map[string]string{}
	d.mu.Lock()
	if m := d.meta[metaKey(key, name)]; m != nil {
		for k, v := range m.Envs {
			env[k] = v
		}
	}
	d.mu.Unlock()
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (d *Door) execute(w http.ResponseWriter, r *http.Request, p *client.Client, key string, h *sandbox.Handle) {
	var req struct {
		Command string            `json:"command"`
		Timeout *uint32           `json:"timeout"`
		Cwd     *string           `json:"cwd"`
		Env     map[string]string `json:"envs"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		apiErr(w, http.StatusBadRequest, "command cannot be empty or whitespace-only")
		return
	}
	// The daemon pipes the command into a shell; here the shell evaluates
	// it after a cd to cwd (relative: from the working directory).
	args := []string{"-c", `eval "$1"`, "sh", req.Command}
	if req.Cwd != nil && *req.Cwd != "" {
		args = []string{"-c", `cd -- "$1" || exit 1; eval "$2"`, "sh", *req.Cwd, req.Command}
	}
	var timeout time.Duration
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	ctx := r.Context()
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: args}, sandbox.ExecOptions{Env: d.envs(key, h.Name, req.Env), StderrToStdout: true, Timeout: timeout})
	if sandbox.IsExecTimeout(err) && timeout > 0 {
		apiErr(w, http.StatusRequestTimeout, fmt.Sprintf("Command execution timed out after %d seconds", *req.Timeout))
		return
	}
	if err != nil {
		fail(w, err, notFoundMsg(h.Name))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"exitCode": res.ExitCode, "result": string(res.Output)})
}
