package spritesdoor

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Checkpoints go to the platform's (the provider's) checkpoints; a
// provider without them is 501 not_supported.

func (c *call) createCheckpoint(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Comment string `json:"comment"`
	}
	if len(body) > 0 && json.Unmarshal(body, &req) != nil {
		apiErr(w, http.StatusBadRequest, "invalid_request", "invalid JSON body")
		return
	}
	id, err := c.p.CreateCheckpoint(r.Context(), c.h, sandbox.CheckpointOptions{Comment: req.Comment})
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	c.d.mu.Lock()
	mk := metaKey(c.key, c.name)
	m := c.d.meta[mk]
	if m == nil {
		m = &meta{Auth: "sprite"}
		c.d.meta[mk] = m
	}
	if m.Checkpoints == nil {
		m.Checkpoints = map[string]checkpointMeta{}
	}
	m.Checkpoints[id] = checkpointMeta{Comment: req.Comment, At: time.Now().UTC()}
	c.d.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"type": "info", "data": "Creating checkpoint..."})
	_ = enc.Encode(map[string]string{"type": "complete", "data": "Checkpoint " + id + " created"})
}

func (c *call) listCheckpoints(w http.ResponseWriter, r *http.Request, one string) {
	ids, err := c.p.Checkpoints(r.Context(), c.h)
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	now := time.Now().UTC()
	kept := map[string]checkpointMeta{}
	c.d.mu.Lock()
	if m := c.d.meta[metaKey(c.key, c.name)]; m != nil {
		for k, v := range m.Checkpoints {
			kept[k] = v
		}
	}
	c.d.mu.Unlock()
	out := []map[string]any{}
	for _, id := range ids {
		at := now
		cm, ok := kept[id]
		if ok {
			at = cm.At
		}
		cp := map[string]any{"id": id, "create_time": at.Format(time.RFC3339Nano), "history": []string{}}
		if cm.Comment != "" {
			cp["comment"] = cm.Comment
		}
		if one == id {
			writeJSON(w, http.StatusOK, cp)
			return
		}
		out = append(out, cp)
	}
	if one != "" {
		apiErr(w, http.StatusNotFound, "not_found", "checkpoint not found")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (c *call) restoreCheckpoint(w http.ResponseWriter, r *http.Request, id string) {
	err := c.p.RestoreCheckpoint(r.Context(), c.h, id)
	if err != nil {
		st, _, _ := statusOf(err)
		if st != http.StatusNotFound {
			fail(w, err, "")
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"type": "info", "data": "Restoring " + id + "..."})
	if err != nil {
		_ = enc.Encode(map[string]string{"type": "error", "error": "checkpoint " + id + " not found"})
		return
	}
	_ = enc.Encode(map[string]string{"type": "complete", "data": "Restored " + id})
}
