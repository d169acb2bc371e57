package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// checkpointLister is a provider that lists a sandbox's checkpoints
// (provider/local); the contract has no listing, so a provider without
// one answers 501 not_supported.
type checkpointLister interface {
	Checkpoints(ctx context.Context, h *sandbox.Handle) ([]string, error)
}

// Checkpoint is one entry of GET .../checkpoints.
type Checkpoint struct {
	ID string `json:"id"`
}

// checkpoints is GET /v1/sandboxes/{name}/checkpoints: the sandbox's
// checkpoints, as its provider lists them.
func (s *Server) checkpoints(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	cl, ok := p.(checkpointLister)
	if !ok {
		writeErr(w, fmt.Errorf("provider %s cannot list checkpoints (a create's answer has each id): %w", rec.Provider, sandbox.ErrNotSupported))
		return
	}
	ids, err := cl.Checkpoints(r.Context(), handleOf(rec))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]Checkpoint, 0, len(ids))
	for _, id := range ids {
		out = append(out, Checkpoint{ID: id})
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
}
