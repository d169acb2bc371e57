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
