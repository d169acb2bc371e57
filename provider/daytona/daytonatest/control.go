package daytonatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The control plane: sandboxes, their states and network settings.

func (s *Server) controlPlane(w http.ResponseWriter, r *http.Request, rest string) {
	parts := []string{}
	if rest != "" {
		parts = strings.Split(rest, "/")
	}
	switch {
	case len(parts) == 0 && r.Method == http.MethodPost:
		s.create(w, r)
	case len(parts) == 0 && r.Method == http.MethodGet:
		s.list(w, r)
	case len(parts) == 1 && r.Method == http.MethodGet && strings.EqualFold(parts[0], "paginated"):
		// The deprecated paginated list owns this path: a sandbox named
		// "paginated" cannot be read by name.
		writeJSON(w, http.StatusOK, map[string]any{"items": []any{}, "total": 0, "page": 1, "totalPages": 0})
	case len(parts) == 1 && r.Method == http.MethodGet && strings.EqualFold(parts[0], "for-runner"):
		apiError(w, http.StatusForbidden, "runner authentication required")
	case len(parts) == 1 && r.Method == http.MethodGet:
		s.mu.Lock()
		sb := s.find(parts[0])
		var rec map[string]any
		if sb != nil && s.state(sb) == "destroyed" {
			sb = nil
		}
		if sb != nil {
			rec = s.record(sb)
		}
		s.mu.Unlock()
		if sb == nil {
			apiError(w, http.StatusNotFound, "Sandbox with ID or name "+parts[0]+" not found")
			return
		}
		writeJSON(w, http.StatusOK, rec)
	case len(parts) == 1 && r.Method == http.MethodDelete:
		// A soft delete (sandbox.service.ts destroy, Sandbox
		// getSoftDeleteUpdate): refused with 409 while a state change is
		// in progress; otherwise the sandbox is renamed
		// DESTROYED_<name>_<ms> with desiredState destroyed, and is
		// "destroying" for DestroyDelay.
		s.mu.Lock()
		sb := s.find(parts[0])
		switch {
		case sb == nil || s.state(sb) == "destroyed":
			s.mu.Unlock()
			apiError(w, http.StatusNotFound, "Sandbox with ID or name "+parts[0]+" not found")
			return
		case sb.State == "destroyed" || s.pending(sb):
			s.mu.Unlock()
			apiError(w, http.StatusConflict, "Sandbox state change in progress")
			return
		}
		s.killLocked(sb)
		_ = os.RemoveAll(sb.dir)
		delete(s.sandboxes, sb.Name)
		sb.Name = fmt.Sprintf("DESTROYED_%s_%d", sb.Name, time.Now().UnixMilli())
		sb.formerState = s.state(sb)
		sb.State, sb.destroyedAt = "destroyed", time.Now()
		sb.sessions, sb.sessionOrder = map[string]*session{}, nil
		s.sandboxes[sb.Name] = sb
		rec := s.record(sb)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, rec)
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "start":
		s.start(w, r, parts[0])
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "stop":
		s.stop(w, parts[0])
	case len(parts) == 2 && r.Method == http.MethodPut && parts[1] == "labels":
		s.replaceLabels(w, r, parts[0])
	case len(parts) == 3 && r.Method == http.MethodPost && (parts[1] == "autostop" || parts[1] == "autoarchive" || parts[1] == "autodelete"):
		s.setInterval(w, parts[0], parts[1], parts[2])
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "network-settings":
		s.network(w, r, parts[0])
	case len(parts) == 4 && r.Method == http.MethodGet && parts[1] == "ports" && parts[3] == "preview-url":
		s.previewURL(w, parts[0], parts[2])
	case len(parts) == 2 && r.Method == http.MethodGet && parts[1] == "toolbox-proxy-url":
		s.mu.Lock()
		sb := s.find(parts[0])
		s.mu.Unlock()
		if sb == nil {
			apiError(w, http.StatusNotFound, "sandbox not found")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"url": s.proxyURL(sb.Target)})
	default:
		apiError(w, http.StatusNotFound, "no route")
	}
}

// find looks a sandbox up by name or id; s.mu held.
func (s *Server) find(key string) *Sandbox {
	if sb, ok := s.sandboxes[key]; ok {
		return sb
	}
	for _, sb := range s.sandboxes {
		if sb.ID == key {
			return sb
		}
	}
	return nil
}

// state is the reported state, with StartDelay applied; s.mu held.
func (s *Server) state(sb *Sandbox) string {
	if sb.State == "started" && time.Since(sb.startedAt) < s.StartDelay {
		return "starting"
	}
	if sb.State == "stopped" && time.Since(sb.stoppedAt) < s.StopDelay {
		return "stopping"
	}
	if sb.State == "destroyed" {
		switch since := time.Since(sb.destroyedAt); {
		case since < s.DestroyPending:
			return sb.formerState
		case since < s.DestroyPending+s.DestroyDelay:
			return "destroying"
		}
	}
	return sb.State
}

// desired is the record's desiredState; s.mu held.
func desired(sb *Sandbox) string {
	switch sb.State {
	case "destroyed":
		return "destroyed"
	case "stopped", "stopping":
		return "stopped"
	case "archived", "archiving":
		return "archived"
	}
	return "started"
}

// pending reports a state change in progress, during which the API
// refuses start, stop and delete with 409 (sandbox.service.ts,
// StateChangeInProgressError); s.mu held.
func (s *Server) pending(sb *Sandbox) bool {
	switch s.state(sb) {
	case "starting", "stopping", "archiving", "destroying", "creating":
		return true
	}
	return false
}

// hold keeps a create or start request open while sb is starting, up to
// Hold (30 s), as the API does.
func (s *Server) hold(ctx context.Context, sb *Sandbox) {
	max := s.Hold
	if max <= 0 {
		max = 30 * time.Second
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		st := s.state(sb)
		s.mu.Unlock()
		if st != "starting" {
			return
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Server) record(sb *Sandbox) map[string]any {
	m := map[string]any{"id": sb.ID, "name": sb.Name, "target": sb.Target, "state": s.state(sb), "desiredState": desired(sb), "labels": sb.Labels,
		"snapshot": sb.Snapshot, "user": "daytona", "organizationId": "org-daytonatest"}
	if sb.ErrorReason != "" {
		m["errorReason"] = sb.ErrorReason
	}
	if s.ProxyURLInRecord {
		m["toolboxProxyUrl"] = s.proxyURL(sb.Target)
	}
	for k, v := range sb.intervals {
		m[k] = v
	}
	m["networkBlockAll"] = sb.NetworkBlockAll
	if sb.NetworkAllowList != "" {
		m["networkAllowList"] = sb.NetworkAllowList
	}
	if sb.DomainAllowList != "" {
		m["domainAllowList"] = sb.DomainAllowList
	}
	return m
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid JSON body")
		return
	}
	name, _ := body["name"].(string)
	id := newID()
	if name == "" {
		name = id
	}
	snap, _ := body["snapshot"].(string)
	if snap != "" && !contains(s.Snapshots, snap) {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Snapshot %s not found. Did you add it through the Daytona Dashboard?", snap))
		return
	}
	labels := map[string]string{}
	if lm, ok := body["labels"].(map[string]any); ok {
		for k, v := range lm {
			labels[k] = fmt.Sprint(v)
		}
	}
	// The API's IsSafeDisplayString refuses URL-like names ("www." anywhere,
	// any case) and control bytes (common/validators/is-safe-string.validator.ts).
	if strings.Contains(strings.ToLower(name), "www.") || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f }) {
		apiError(w, http.StatusBadRequest, "name must not contain HTML tags, URLs, or control characters")
		return
	}
	s.mu.Lock()
	if _, exists := s.sandboxes[name]; exists {
		s.mu.Unlock()
		st := s.ConflictStatus
		if st == 0 {
			st = http.StatusConflict
		}
		apiError(w, st, fmt.Sprintf("Sandbox with name %s already exists", name))
		return
	}
	dir := filepath.Join(s.root, id)
	for _, d := range []string{"home", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			s.mu.Unlock()
			apiError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	target := s.Target
	if t, ok := body["target"].(string); ok && t != "" {
		target = t
	}
	if target == "" {
		target = defaultTarget
	}
	sb := &Sandbox{ID: id, Name: name, State: "started", Snapshot: snap, Labels: labels, Create: body, Target: target,
		dir: dir, startedAt: time.Now(), sessions: map[string]*session{}, procs: map[*exec.Cmd]bool{}}
	s.sandboxes[name] = sb
	s.mu.Unlock()
	s.hold(r.Context(), sb)
	s.mu.Lock()
	rec := s.record(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, rec)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := map[string]string{}
	if l := q.Get("labels"); l != "" {
		if err := json.Unmarshal([]byte(l), &want); err != nil {
			apiError(w, http.StatusBadRequest, "labels must be a JSON object")
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "bad limit")
			return
		}
		limit = n
	}
	if s.PageSize > 0 && s.PageSize < limit {
		limit = s.PageSize
	}
	start := 0
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "bad cursor")
			return
		}
		start = n
	}
	s.mu.Lock()
	var all []*Sandbox
	for _, sb := range s.sandboxes {
		// The search leaves out destroyed sandboxes, not destroying ones
		// (adapters/sandbox-typeorm-search.adapter.ts).
		ok := s.state(sb) != "destroyed"
		for k, v := range want {
			if sb.Labels[k] != v {
				ok = false
			}
		}
		if ok {
			all = append(all, sb)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	items := []map[string]any{}
	for i := start; i < len(all) && i < start+limit; i++ {
		items = append(items, s.record(all[i]))
	}
	s.mu.Unlock()
	resp := map[string]any{"items": items, "nextCursor": nil}
	if start+limit < len(all) {
		resp["nextCursor"] = strconv.Itoa(start + limit)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request, key string) {
	s.mu.Lock()
	sb := s.find(key)
	st := ""
	if sb != nil {
		st = s.state(sb)
	}
	switch {
	case sb == nil || st == "destroyed":
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	case sb.State == "destroyed" || s.pending(sb):
		// A deleted sandbox's desiredState is destroyed: start refuses it
		// as a state change in progress (sandbox.service.ts start).
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	case sb.State == "error" || sb.State == "build_failed":
		s.mu.Unlock()
		apiError(w, http.StatusBadRequest, "Sandbox is in an errored state")
		return
	case sb.State != "started":
		sb.State, sb.startedAt = "started", time.Now()
	}
	s.mu.Unlock()
	s.hold(r.Context(), sb)
	s.mu.Lock()
	rec := s.record(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, rec)
}

func (s *Server) stop(w http.ResponseWriter, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	switch {
	case sb == nil || s.state(sb) == "destroyed":
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	case s.pending(sb):
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	case sb.State == "started":
		// The machine stops: its processes die and the daemon forgets its
		// sessions; the disk stays.
		s.killLocked(sb)
		sb.sessions, sb.sessionOrder = map[string]*session{}, nil
		sb.State, sb.stoppedAt = "stopped", time.Now()
	case sb.State != "stopped" && sb.State != "archived":
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	}
	writeJSON(w, http.StatusOK, s.record(sb))
}

// domainRE is the API's domain check (apps/api network-validation.util.ts,
// validateDomainAllowList): host labels, optionally behind one "*.".
var domainRE = regexp.MustCompile(`^(\*\.)?([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,}$`)

// network applies POST /sandbox/{id}/network-settings as the API does
// (sandbox.service.ts, updateNetworkSettings): each field present updates
// the stored value; networkBlockAll true clears the CIDR list, a non-empty
// networkAllowList clears networkBlockAll, and an empty string clears a
// list. The stored values then go to the runner, whose effect Egress
// reports.
func (s *Server) network(w http.ResponseWriter, r *http.Request, key string) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid JSON body")
		return
	}
	str := func(k string) (string, bool, bool) {
		v, ok := body[k]
		if !ok || v == nil {
			return "", false, true
		}
		x, isStr := v.(string)
		return x, true, isStr
	}
	dom, hasDom, ok := str("domainAllowList")
	if !ok {
		apiError(w, http.StatusBadRequest, "domainAllowList must be a string")
		return
	}
	cidr, hasCIDR, ok := str("networkAllowList")
	if !ok {
		apiError(w, http.StatusBadRequest, "networkAllowList must be a string")
		return
	}
	var blockAll, hasBlock bool
	if v, ok := body["networkBlockAll"]; ok && v != nil {
		b, isBool := v.(bool)
		if !isBool {
			apiError(w, http.StatusBadRequest, "networkBlockAll must be a boolean value")
			return
		}
		blockAll, hasBlock = b, true
	}
	if !hasDom && !hasCIDR && !hasBlock {
		apiError(w, http.StatusBadRequest, "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided")
		return
	}
	if hasDom && strings.TrimSpace(dom) != "" {
		ds := strings.Split(dom, ",")
		for _, d := range ds {
			if d = strings.TrimSpace(d); d != "" && !domainRE.MatchString(d) {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("Invalid domain: %q. Must be a valid domain name", d))
				return
			}
		}
		if len(ds) > 10 {
			apiError(w, http.StatusBadRequest, "Domain allow list cannot contain more than 10 domains")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	}
	sb.Policy = body
	sb.Policies = append(sb.Policies, body)
	if hasDom {
		sb.DomainAllowList = strings.TrimSpace(dom)
		if sb.DomainAllowList != "" {
			sb.DomainAllowList = dom
		}
	}
	if hasBlock {
		sb.NetworkBlockAll = blockAll
		if blockAll {
			sb.NetworkAllowList = ""
		}
	}
	switch {
	case hasCIDR && strings.TrimSpace(cidr) != "":
		sb.NetworkAllowList, sb.NetworkBlockAll = cidr, false
	case hasCIDR:
		sb.NetworkAllowList = ""
	case hasBlock && !blockAll:
		sb.NetworkAllowList = ""
	}
	writeJSON(w, http.StatusOK, s.record(sb))
}

// Egress is the named sandbox's effective outbound policy as the runner
// applies it: "blocked" (networkBlockAll wins over every list), "cidr:<list>",
// "domains:<list>" — only where EnforceDomains is set; the public-source
// runner (apps/runner pkg/docker/network.go) never reads domainAllowList —,
// or "open". "" for an unknown sandbox.
func (s *Server) Egress(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[name]
	switch {
	case !ok:
		return ""
	case sb.NetworkBlockAll:
		return "blocked"
	case sb.NetworkAllowList != "":
		return "cidr:" + sb.NetworkAllowList
	case s.EnforceDomains && sb.DomainAllowList != "":
		return "domains:" + sb.DomainAllowList
	}
	return "open"
}

// EnforcesEgress reports whether the fake enforces a sandbox's egress on
// the commands it runs: as root it does, by running them in a network
// namespace of their own (only a loopback that is down) whenever Egress
// is not "open". That is networkBlockAll exactly, and stricter than
// Daytona for a CIDR or domain list (those hosts are refused too): enough
// for a test that observes what a policy refuses, never one that needs
// the allowed hosts. Without root commands share the host's network,
// whatever the policy.
func (s *Server) EnforcesEgress() bool { return os.Geteuid() == 0 }

// netFlags is the clone flags of a command of sb: a network namespace of
// its own where EnforcesEgress and sb's egress is not open.
func (s *Server) netFlags(sb *Sandbox) uintptr {
	if !s.EnforcesEgress() {
		return 0
	}
	s.mu.Lock()
	closed := sb.NetworkBlockAll || sb.NetworkAllowList != "" || (s.EnforceDomains && sb.DomainAllowList != "")
	s.mu.Unlock()
	if closed {
		return syscall.CLONE_NEWNET
	}
	return 0
}

// killLocked kills every process group of sb; s.mu held.
func (s *Server) killLocked(sb *Sandbox) {
	for c := range sb.procs {
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	}
}
