package client

import (
	"context"
	"net/http"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// Checkpoints lists the sandbox's checkpoints (GET .../checkpoints), where
// the provider it lives on lists them (local); elsewhere ErrNotSupported.
// The contract has no listing: this is what `managoat checkpoint ls` finds
// on a provider by type assertion.
func (c *Client) Checkpoints(ctx context.Context, h *sandbox.Handle) ([]string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	var out struct {
		Data []api.Checkpoint `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, c.path(h.Name, "checkpoints"), nil, &out); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(out.Data))
	for _, cp := range out.Data {
		ids = append(ids, cp.ID)
	}
	return ids, nil
}
