package e2bdoor

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

const stamp = "2006-01-02T15:04:05.000Z07:00"

// serveAPI is E2B's control plane.
func (d *Door) serveAPI(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		apiErr(w, http.StatusUnauthorized, "Invalid API key")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		apiErr(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	p, err := d.providerFor(r, key)
	if err != nil {
		apiErr(w, http.StatusUnauthorized, "Invalid API key")
		return
	}
	defer p.Close()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) > 0 && parts[0] == "v2" {
		parts = parts[1:]
	}
	switch {
	case len(parts) == 1 && parts[0] == "sandboxes" && r.Method == http.MethodPost:
		d.create(w, r, p, key, body)
	case len(parts) == 1 && parts[0] == "sandboxes" && r.Method == http.MethodGet:
		d.list(w, r, p, key)
	case len(parts) == 2 && parts[0] == "sandboxes":
		d.sandboxOp(w, r, p, key, parts[1], "", body)
	case len(parts) == 3 && parts[0] == "sandboxes":
		d.sandboxOp(w, r, p, key, parts[1], parts[2], body)
	case len(parts) > 0 && (parts[0] == "templates" || parts[0] == "volumes" || parts[0] == "secrets" || parts[0] == "snapshots"):
		apiErr(w, http.StatusNotImplemented, parts[0]+" are not supported by managoat's E2B front door")
	default:
		apiErr(w, http.StatusNotFound, "no such route")
	}
}

func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "i" + hex.EncodeToString(b[:])
}

func (d *Door) create(w http.ResponseWriter, r *http.Request, p *client.Client, key string, body []byte) {
	var req struct {
		TemplateID string            `json:"templateID"`
		Timeout    *int              `json:"timeout"`
		Metadata   map[string]string `json:"metadata"`
		EnvVars    map[string]string `json:"envVars"`
		Network    networkReq        `json:"network"`
		Internet   *bool             `json:"allow_internet_access"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	if t := strings.ToLower(req.TemplateID); t != "" && t != "base" && t != "base:default" {
		apiErr(w, http.StatusNotFound, "template '"+req.TemplateID+"' not found")
		return
	}
	timeout := 300
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout < 1 {
		apiErr(w, http.StatusBadRequest, "timeout must be at least 1")
		return
	}
	if len(req.Metadata) > 64 || len(req.EnvVars) > 256 {
		apiErr(w, http.StatusBadRequest, "too many metadata entries or envVars")
		return
	}
	req.Network.Internet = req.Internet
	allow, open, err := policyOf(req.Network)
	if err != nil {
		apiErr(w, http.StatusBadRequest, err.Error())
		return
	}
	id := newID()
	// A fresh random name: Create cannot adopt another's sandbox, and it
	// carries the metadata onto the record as labels (metaLabels).
	h, err := p.Create(r.Context(), id, sandbox.CreateOptions{Labels: metaLabels(req.Metadata)})
	if err != nil {
		st, msg := statusOf(err)
		apiErr(w, st, msg)
		return
	}
	if !open {
		if err := p.ApplyNetworkPolicy(r.Context(), h, sandbox.NetworkPolicy{Allow: allow}); err != nil {
			_ = p.Destroy(context.WithoutCancel(r.Context()), h) // no sandbox without the policy it was asked with
			st, msg := statusOf(err)
			apiErr(w, st, msg)
			return
		}
	}
	now := time.Now()
	m := &meta{Template: "base", Metadata: req.Metadata, Envs: req.EnvVars, StartedAt: now, EndAt: now.Add(time.Duration(timeout) * time.Second)}
	if m.Metadata == nil {
		m.Metadata = map[string]string{}
	}
	d.mu.Lock()
	d.meta[metaKey(key, id)] = m
	d.armLocked(key, id, m.EndAt)
	d.mu.Unlock()
	writeJSON(w, http.StatusCreated, d.started(key, id))
}

func (d *Door) started(key, id string) map[string]any {
	return map[string]any{"templateID": "base", "sandboxID": id, "clientID": "managoat", "envdVersion": EnvdVersion,
		"envdAccessToken": d.token(key, id), "domain": nil, "trafficAccessToken": nil}
}

// metaOf is the door's record of id, or one made from the platform's.
func (d *Door) metaOf(key string, s api.Sandbox) meta {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.meta[metaKey(key, s.Name)]; m != nil {
		return *m
	}
	return meta{Template: "base", Metadata: metadataOf(s.Labels), StartedAt: s.CreatedAt, EndAt: s.CreatedAt.Add(300 * time.Second)}
}

// metaLabelPrefix marks the record labels that hold a sandbox's E2B
// metadata, so that it outlives the door (a restart of serve) and is seen
// by every key of the account.
const metaLabelPrefix = "e2b.metadata/"

// metaLabels is the metadata the record's labels can hold (api's label
// bounds: at most api.MaxLabels, keys of [A-Za-z0-9._/-]); an entry past
// them is kept by the door alone, in memory.
func metaLabels(md map[string]string) map[string]string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string]string{}
	for _, k := range keys {
		one := map[string]string{metaLabelPrefix + k: md[k]}
		if len(out) == api.MaxLabels || api.ValidateLabels(one) != nil {
			continue
		}
		out[metaLabelPrefix+k] = md[k]
	}
	return out
}

// metadataOf is the E2B metadata a record's labels hold.
func metadataOf(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if strings.HasPrefix(k, metaLabelPrefix) {
			out[strings.TrimPrefix(k, metaLabelPrefix)] = v
		}
	}
	return out
}

// stateOf is E2B's state of a platform record: running or paused, or
// false when E2B would not list it.
func stateOf(s api.Sandbox) (string, bool) {
	switch s.State {
	case "running", "creating":
		return "running", true
	case "suspended", "parked", "parking":
		return "paused", true
	}
	return "", false
}

func (d *Door) listed(key string, s api.Sandbox, state string) map[string]any {
	m := d.metaOf(key, s)
	return map[string]any{"templateID": m.Template, "sandboxID": s.Name, "clientID": "managoat",
		"startedAt": m.StartedAt.UTC().Format(stamp), "endAt": m.EndAt.UTC().Format(stamp),
		"cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024, "metadata": m.Metadata, "state": state, "envdVersion": EnvdVersion}
}

func (d *Door) list(w http.ResponseWriter, r *http.Request, p *client.Client, key string) {
	q := r.URL.Query()
	states := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, x := range strings.Split(st, ",") {
			states[x] = true
		}
	}
	var want url.Values
	if q.Has("metadata") {
		v, err := url.ParseQuery(q.Get("metadata"))
		if err != nil {
			apiErr(w, http.StatusBadRequest, "error parsing metadata: "+err.Error())
			return
		}
		want = v
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			apiErr(w, http.StatusBadRequest, "limit must be 1..100")
			return
		}
		limit = n
	}
	var after string
	if t := q.Get("nextToken"); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		if err != nil {
			apiErr(w, http.StatusBadRequest, "bad nextToken")
			return
		}
		after = string(b)
	}
	all, err := p.List(r.Context())
	if err != nil {
		st, msg := statusOf(err)
		apiErr(w, st, msg)
		return
	}
	sort.Slice(all, func(i, j int) bool { return cursor(all[i]) > cursor(all[j]) })
	page := []map[string]any{}
	var last string
	for _, s := range all {
		if after != "" && cursor(s) >= after {
			continue
		}
		state, ok := stateOf(s)
		if !ok || !states[state] {
			continue
		}
		m := d.metaOf(key, s)
		match := true
		for k, vs := range want {
			for _, v := range vs {
				if m.Metadata[k] != v {
					match = false
				}
			}
		}
		if !match {
			continue
		}
		if len(page) == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(last)))
			break
		}
		page = append(page, d.listed(key, s, state))
		last = cursor(s)
	}
	writeJSON(w, http.StatusOK, page)
}

// cursor orders the listing, newest first: creation time, then name.
func cursor(s api.Sandbox) string {
	return strconv.FormatInt(s.CreatedAt.UnixNano(), 36) + "\x00" + s.Name
}

func (d *Door) sandboxOp(w http.ResponseWriter, r *http.Request, p *client.Client, key, id, action string, body []byte) {
	if sandbox.ValidateName(id) != nil {
		apiErr(w, http.StatusNotFound, "sandbox \""+id+"\" not found")
		return
	}
	h := &sandbox.Handle{Provider: client.Name, Name: id}
	s, err := p.Lookup(r.Context(), h)
	if err != nil {
		st, msg := statusOf(err)
		if st == http.StatusNotFound {
			msg = "sandbox \"" + id + "\" not found"
		}
		apiErr(w, st, msg)
		return
	}
	state, _ := stateOf(s)
	var t struct {
		Timeout *int `json:"timeout"`
	}
	fail := func(err error) {
		st, msg := statusOf(err)
		apiErr(w, st, msg)
	}
	switch {
	case action == "" && r.Method == http.MethodGet:
		m := d.listed(key, s, state)
		m["envdAccessToken"] = d.token(key, id)
		m["domain"] = nil
		writeJSON(w, http.StatusOK, m)
	case action == "" && r.Method == http.MethodDelete:
		if err := p.Destroy(r.Context(), h); err != nil {
			fail(err)
			return
		}
		d.forget(key, id)
		w.WriteHeader(http.StatusNoContent)
	case action == "pause" && r.Method == http.MethodPost:
		if state == "paused" {
			apiErr(w, http.StatusConflict, "Error pausing sandbox - sandbox '"+id+"' is already paused")
			return
		}
		if err := p.Suspend(r.Context(), h); err != nil {
			fail(err)
			return
		}
		d.disarm(key, id)
		w.WriteHeader(http.StatusNoContent)
	case action == "connect" && r.Method == http.MethodPost, action == "timeout" && r.Method == http.MethodPost:
		if len(strings.TrimSpace(string(body))) > 0 && json.Unmarshal(body, &t) != nil {
			apiErr(w, http.StatusBadRequest, "invalid request body")
			return
		}
		if action == "timeout" && t.Timeout == nil {
			apiErr(w, http.StatusBadRequest, "timeout is required")
			return
		}
		if t.Timeout == nil {
			t.Timeout = new(int)
			*t.Timeout = 300
		}
		status := http.StatusOK
		if action == "connect" && state == "paused" {
			if _, err := p.Resume(r.Context(), h); err != nil {
				fail(err)
				return
			}
			status = http.StatusCreated
		}
		end := time.Now().Add(time.Duration(*t.Timeout) * time.Second)
		d.mu.Lock()
		mk := metaKey(key, id)
		if d.meta[mk] == nil {
			m := meta{Template: "base", Metadata: map[string]string{}, StartedAt: s.CreatedAt}
			d.meta[mk] = &m
		}
		if action == "timeout" || end.After(d.meta[mk].EndAt) {
			d.meta[mk].EndAt = end
		}
		d.armLocked(key, id, d.meta[mk].EndAt)
		d.mu.Unlock()
		if action == "timeout" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, status, d.started(key, id))
	case action == "network" && r.Method == http.MethodPut:
		d.updateNetwork(w, r, p, h, body)
	case action == "metrics" || action == "logs" || action == "snapshots" || action == "refreshes":
		apiErr(w, http.StatusNotImplemented, action+" is not supported by managoat's E2B front door")
	default:
		apiErr(w, http.StatusNotFound, "no such route")
	}
}

// forget drops what the door keeps of a killed sandbox.
func (d *Door) forget(key, id string) {
	d.mu.Lock()
	delete(d.meta, metaKey(key, id))
	if tm := d.timers[metaKey(key, id)]; tm != nil {
		tm.Stop()
		delete(d.timers, metaKey(key, id))
	}
	t := d.procs[metaKey(key, id)]
	delete(d.procs, metaKey(key, id))
	d.mu.Unlock()
	if t != nil {
		t.stopAll()
	}
}

// armLocked sets sandbox id's end: at end the door kills it (E2B's
// timeout), through the platform as the key that set it. A pause
// disarms it (a paused sandbox does not time out in E2B). d.mu is held.
func (d *Door) armLocked(key, id string, end time.Time) {
	mk := metaKey(key, id)
	if tm := d.timers[mk]; tm != nil {
		tm.Stop()
	}
	select {
	case <-d.done:
		return
	default:
	}
	var tm *time.Timer
	tm = time.AfterFunc(time.Until(end), func() {
		d.mu.Lock()
		select {
		case <-d.done:
			d.mu.Unlock()
			return
		default:
		}
		if d.timers[mk] != tm {
			d.mu.Unlock()
			return // re-armed or forgotten since
		}
		delete(d.timers, mk)
		d.wg.Add(1)
		d.mu.Unlock()
		defer d.wg.Done()
		d.expire(key, id)
	})
	d.timers[mk] = tm
}

// disarm stops sandbox id's end (a pause: connect arms it again).
func (d *Door) disarm(key, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if tm := d.timers[metaKey(key, id)]; tm != nil {
		tm.Stop()
		delete(d.timers, metaKey(key, id))
	}
}

// expire kills sandbox id at its end.
func (d *Door) expire(key, id string) {
	p, err := d.api.ClientFor(nil, key)
	if err != nil {
		return
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	h := &sandbox.Handle{Provider: client.Name, Name: id}
	if err := p.Destroy(ctx, h); err == nil || errors.Is(err, sandbox.ErrNotFound) {
		d.forget(key, id)
	}
}
