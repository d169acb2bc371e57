package jail

import "context"

// LayerBytes is layerBytes of sandbox id: what its writable layer holds
// on the host.
func (j *Jail) LayerBytes(ctx context.Context, id string) (int64, error) {
	st, err := readState(j.dir(id))
	if err != nil {
		return 0, err
	}
	return layerBytes(ctx, j.dir(id), st), nil
}

// NoOverlay makes this process's jails take the host for one without
// overlayfs (image sandboxes on a copy of their image) until t ends.
// Not for parallel tests.
func NoOverlay(t interface{ Cleanup(func()) }) {
	old := overlayOnce
	overlayOnce = func() bool { return false }
	t.Cleanup(func() { overlayOnce = old })
}
