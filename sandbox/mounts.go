package sandbox

import "fmt"

// Mount is a host file or directory bound into a sandbox
// (CreateOptions.Mounts), as docker's -v HOST:SANDBOX[:ro].
type Mount struct {
	// Source is the host path (absolute; its symbolic links are
	// resolved once, when the sandbox is made).
	Source string `json:"source"`
	// Target is the absolute path inside the sandbox.
	Target string `json:"target"`
	// ReadOnly refuses every write through the mount (EROFS).
	ReadOnly bool `json:"read_only,omitempty"`
}

// String is docker's notation, SOURCE:TARGET[:ro].
func (m Mount) String() string {
	s := m.Source + ":" + m.Target
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// CheckNoMounts is for providers that cannot bind host paths into their
// sandboxes (hosted ones, the runner, the fake): it refuses options with
// Mounts, ErrNotSupported naming the option, so that a mount is never
// silently dropped. Call it first thing in Create.
func CheckNoMounts(provider string, opts CreateOptions) error {
	if len(opts.Mounts) == 0 {
		return nil
	}
	return fmt.Errorf("%w: provider %s cannot bind host paths into a sandbox (CreateOptions.Mounts %v, run -v); mounts are the local provider's",
		ErrNotSupported, provider, opts.Mounts)
}
