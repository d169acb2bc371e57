package spritestest

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

func (s *Server) createCheckpoint(w http.ResponseWriter, sp *sprite, body []byte) {
	var req struct {
		Comment string `json:"comment"`
	}
	if len(body) > 0 && json.Unmarshal(body, &req) != nil {
		apiError(w, http.StatusBadRequest, "invalid_request", "bad JSON")
		return
	}
	dir, err := s.spriteDir(sp)
	if err != nil {
		apiError(w, http.StatusInternalServerError, "internal", "no directory")
		return
	}
	s.mu.Lock()
	sp.nextCP++
	id := "v" + strconv.Itoa(sp.nextCP)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"type": "info", "data": "Creating checkpoint..."})
	snap := filepath.Join(s.root, "checkpoints", sp.id, id)
	if err := copyTree(dir, snap); err != nil {
		_ = enc.Encode(map[string]string{"type": "error", "error": "checkpoint failed"})
		return
	}
	s.mu.Lock()
	sp.checkpoints = append(sp.checkpoints, &checkpoint{id: id, comment: req.Comment, at: time.Now().UTC(), dir: snap})
	s.mu.Unlock()
	_ = enc.Encode(map[string]string{"type": "complete", "data": "Checkpoint " + id + " created"})
}

func (s *Server) listCheckpoints(w http.ResponseWriter, sp *sprite) {
	s.mu.Lock()
	cps := append([]*checkpoint(nil), sp.checkpoints...)
	s.mu.Unlock()
	sort.Slice(cps, func(i, j int) bool { return cps[i].at.After(cps[j].at) })
	out := []map[string]any{{"id": "Current", "create_time": time.Now().UTC().Format(time.RFC3339Nano), "history": []string{}}}
	for _, c := range cps {
		m := map[string]any{"id": c.id, "create_time": c.at.Format(time.RFC3339Nano), "history": []string{}}
		if c.comment != "" {
			m["comment"] = c.comment
		}
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
}

// restoreCheckpoint streams NDJSON; an unknown id is an error element in
// a 200 stream, as a failed restore is.
func (s *Server) restoreCheckpoint(w http.ResponseWriter, sp *sprite, id string) {
	s.mu.Lock()
	var cp *checkpoint
	for _, c := range sp.checkpoints {
		if c.id == id {
			cp = c
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"type": "info", "data": "Restoring " + id + "..."})
	if cp == nil {
		_ = enc.Encode(map[string]string{"type": "error", "error": "checkpoint " + id + " not found"})
		return
	}
	dir, err := s.spriteDir(sp)
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = copyTree(cp.dir, dir)
	}
	if err != nil {
		_ = enc.Encode(map[string]string{"type": "error", "error": "restore failed"})
		return
	}
	_ = enc.Encode(map[string]string{"type": "complete", "data": "Restored " + id})
}

// copyTree copies regular files and directories from src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, info.Mode().Perm())
		}
		return nil
	})
}
