package runner

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// NamePrefix starts every runner sandbox name.
const NamePrefix = "runner-"

// For mints a sandbox name on the runner with the given id (a UUID, dashed
// or not, any case): runner-<32 lowercase hex>-<8 random hex>, 48 bytes.
// Two names minted for one runner differ.
func For(runnerID string) (string, error) {
	hexID := strings.ReplaceAll(runnerID, "-", "")
	if len(hexID) != 32 || !isHex(hexID) {
		return "", sandbox.Invalid("runner_id", fmt.Sprintf("runner id %q is not a UUID", runnerID))
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	return NamePrefix + strings.ToLower(hexID) + "-" + hex.EncodeToString(r[:]), nil
}

// Parse returns the runner id (the lowercase dashed UUID) a sandbox name
// routes to. The name must start with "runner-", then 32 hex digits (any
// case), then "-"; the suffix is not checked. Anything else is
// Invalid{not_a_runner_sandbox_name}.
func Parse(name string) (string, error) {
	bad := sandbox.Invalid("not_a_runner_sandbox_name", fmt.Sprintf("%q is not a runner sandbox name", clip(name, 80)))
	if !strings.HasPrefix(name, NamePrefix) {
		return "", bad
	}
	rest := name[len(NamePrefix):]
	if len(rest) < 33 || rest[32] != '-' || !isHex(rest[:32]) {
		return "", bad
	}
	return dashed(strings.ToLower(rest[:32])), nil
}

func dashed(h string) string {
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// StableID is the default runner id: a UUID derived from the account and
// the runner's name, so a runner keeps its id (and its sandboxes keep
// routing) across reconnects, platform restarts and a forget. Fountain's platform
// minted a new id after a deletion and orphaned the runner's sandboxes.
func StableID(account, name string) string {
	sum := sha256.Sum256([]byte(account + "\x00" + name))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8 (RFC 9562 custom)
	b[8] = b[8]&0x3f | 0x80 // variant
	return dashed(hex.EncodeToString(b))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
