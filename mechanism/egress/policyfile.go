package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// SavePolicy records allow (nil: deny all, as []) at path, atomically, so
// that a sandbox started again (a new manager adopting it) is put back
// under the policy last applied. Both mechanisms that serve egress keep
// their sandboxes' policies this way.
func SavePolicy(path string, allow []string) error {
	if allow == nil {
		allow = []string{}
	}
	b, _ := json.Marshal(allow)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// LoadPolicy is the policy a starting sandbox is put under: the one
// SavePolicy recorded at path, else initial (its Spec's allow list) when
// it has entries, else nil (every public destination).
func LoadPolicy(path string, initial []string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		var allow []string
		if err := json.Unmarshal(b, &allow); err != nil {
			return nil, fmt.Errorf("egress policy %s: %w", path, err)
		}
		return ParsePolicy(allow)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if len(initial) > 0 {
		return ParsePolicy(initial)
	}
	return nil, nil
}
