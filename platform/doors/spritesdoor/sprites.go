package spritesdoor

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// statusOfSprite is Sprites' status of a platform record: running, or
// cold for a suspended or parked one (an exec wakes it, as Sprites'
// does).
func statusOfSprite(s api.Sandbox) string {
	switch s.State {
	case "suspended", "parked", "parking":
		return "cold"
	}
	return "running"
}

func (d *Door) spriteJSON(key string, s api.Sandbox) map[string]any {
	m := meta{Auth: "sprite", Labels: []string{}}
	d.mu.Lock()
	if mt := d.meta[metaKey(key, s.Name)]; mt != nil {
		m = *mt
	}
	d.mu.Unlock()
	if m.Labels == nil {
		m.Labels = []string{}
	}
	out := map[string]any{
		"id": spriteID(s), "name": s.Name, "organization": "managoat", "status": statusOfSprite(s),
		"url_settings": map[string]string{"auth": m.Auth}, "labels": m.Labels,
		"created_at": s.CreatedAt.UTC().Format(time.RFC3339), "updated_at": s.LastActivity.UTC().Format(time.RFC3339),
	}
	if s.URL != "" {
		out["url"] = s.URL
	}
	return out
}

// spriteID is a sprite's id: the platform's instance id where it has
// one, else the name and creation time, so a sprite made anew under an
// old name has a new id.
func spriteID(s api.Sandbox) string {
	if s.InstanceID != "" {
		return "sprite-" + s.InstanceID
	}
	return "sprite-" + s.Name + "-" + strconv.FormatInt(s.CreatedAt.UnixNano(), 36)
}

type urlSettings struct {
	Auth string `json:"auth"`
}

func (c *call) create(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Name        string       `json:"name"`
		URLSettings *urlSettings `json:"url_settings"`
		Labels      []string     `json:"labels"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid_request", "invalid JSON body: "+err.Error())
		return
	}
	if err := sandbox.ValidateName(req.Name); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid_request", "a valid name is required: "+err.Error())
		return
	}
	auth := "sprite"
	if req.URLSettings != nil {
		if req.URLSettings.Auth != "public" && req.URLSettings.Auth != "sprite" {
			apiErr(w, http.StatusBadRequest, "invalid_request", "url_settings.auth must be public or sprite")
			return
		}
		auth = req.URLSettings.Auth
	}
	if len(req.Labels) > 64 {
		apiErr(w, http.StatusBadRequest, "invalid_request", "too many labels")
		return
	}
	h, err := c.p.CreateNew(r.Context(), req.Name, sandbox.CreateNewOptions{})
	if err != nil {
		fail(w, err, "")
		return
	}
	c.d.mu.Lock()
	c.d.meta[metaKey(c.key, req.Name)] = &meta{Auth: auth, Labels: req.Labels}
	c.d.mu.Unlock()
	s, err := c.p.Lookup(r.Context(), h)
	if err != nil {
		s = api.Sandbox{Name: req.Name, State: "running", CreatedAt: time.Now(), LastActivity: time.Now()}
	}
	writeJSON(w, http.StatusCreated, c.d.spriteJSON(c.key, s))
}

func (c *call) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	pageSize := 50
	if v := q.Get("max_results"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "bad max_results")
			return
		}
		pageSize = min(n, 1000)
	}
	after := ""
	if tok := q.Get("continuation_token"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			apiErr(w, http.StatusBadRequest, "invalid_request", "bad continuation token")
			return
		}
		after = string(b)
	}
	all, err := c.p.List(r.Context())
	if err != nil {
		fail(w, err, "")
		return
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	prefix := q.Get("prefix")
	page := []map[string]any{}
	more, last := false, ""
	for _, s := range all {
		if !strings.HasPrefix(s.Name, prefix) || (after != "" && s.Name <= after) {
			continue
		}
		if s.State == "deleting" || s.State == "destroyed" {
			continue
		}
		if len(page) == pageSize {
			more = true
			break
		}
		page = append(page, c.d.spriteJSON(c.key, s))
		last = s.Name
	}
	out := map[string]any{"sprites": page, "has_more": more}
	if more {
		out["next_continuation_token"] = base64.RawURLEncoding.EncodeToString([]byte(last))
	}
	writeJSON(w, http.StatusOK, out)
}

// spriteRoute is GET, PUT and DELETE /v1/sprites/{name}.
func (c *call) spriteRoute(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, c.d.spriteJSON(c.key, c.sb))
	case http.MethodPut:
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		var req struct {
			URLSettings *urlSettings `json:"url_settings"`
			Labels      *[]string    `json:"labels"`
		}
		if json.Unmarshal(body, &req) != nil {
			apiErr(w, http.StatusBadRequest, "invalid_request", "invalid JSON body")
			return
		}
		if req.URLSettings != nil && req.URLSettings.Auth != "" && req.URLSettings.Auth != "public" && req.URLSettings.Auth != "sprite" {
			apiErr(w, http.StatusBadRequest, "invalid_request", "url_settings.auth must be public or sprite")
			return
		}
		if req.Labels != nil && len(*req.Labels) > 64 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "too many labels")
			return
		}
		c.d.mu.Lock()
		mk := metaKey(c.key, c.name)
		m := c.d.meta[mk]
		if m == nil {
			m = &meta{Auth: "sprite"}
			c.d.meta[mk] = m
		}
		if req.URLSettings != nil && req.URLSettings.Auth != "" {
			m.Auth = req.URLSettings.Auth
		}
		if req.Labels != nil {
			m.Labels = *req.Labels
		}
		c.d.mu.Unlock()
		writeJSON(w, http.StatusOK, c.d.spriteJSON(c.key, c.sb))
	case http.MethodDelete:
		if err := c.p.Destroy(r.Context(), c.h); err != nil {
			fail(w, err, "sprite not found")
			return
		}
		c.d.mu.Lock()
		delete(c.d.meta, metaKey(c.key, c.name))
		c.d.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		apiErr(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method)
	}
}
