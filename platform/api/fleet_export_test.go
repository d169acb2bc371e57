package api

import (
	"context"

	"github.com/managoat/managoat/platform/store"
	runnerprov "github.com/managoat/managoat/provider/runner"
)

// PlaceForTest is the placement of a create (place, with the store's
// InsertSandboxWithin and without the account's count), for the fleet
// benchmark.
func PlaceForTest(ctx context.Context, s *Server, rec store.Sandbox, rp *runnerprov.Provider, p Placement) (store.Sandbox, error) {
	return s.place(WithPlacement(ctx, p), rec, rp, s.cfg.Store.InsertSandboxWithin)
}

// PlaceWithForTest is PlaceForTest through insert (the benchmark times
// the store's part apart).
func PlaceWithForTest(ctx context.Context, s *Server, rec store.Sandbox, rp *runnerprov.Provider, p Placement, insert func(context.Context, store.Sandbox, store.Room) error) (store.Sandbox, error) {
	return s.place(WithPlacement(ctx, p), rec, rp, insert)
}
