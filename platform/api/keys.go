package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/store"
)

// KeyPrefix starts every API key: mgk_<16 hex id>_<43 base64url secret>.
// The id is the key's public name (stored as it is); only the SHA-256 of
// the secret is stored.
const KeyPrefix = "mgk_"

// NewKey makes an API key for the account and stores its hash. The key is
// returned once and stored nowhere.
func NewKey(ctx context.Context, st store.Store, accountID, label string) (string, error) {
	var id [8]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", err
	}
	sec := base64.RawURLEncoding.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(sec))
	k := store.Key{ID: hex.EncodeToString(id[:]), AccountID: accountID, Hash: sum[:], Label: label, CreatedAt: time.Now().UTC()}
	if err := st.AddKey(ctx, k); err != nil {
		return "", err
	}
	return KeyPrefix + k.ID + "_" + sec, nil
}

// KeyID returns the public id of a key ("" when it is not shaped like one).
func KeyID(key string) string {
	id, _, ok := splitKey(key)
	if !ok {
		return ""
	}
	return id
}

func splitKey(key string) (id, secret string, ok bool) {
	rest, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok || len(rest) < 18 || rest[16] != '_' {
		return "", "", false
	}
	return rest[:16], rest[17:], true
}

// ErrBadKey is every refusal of a key: unknown, wrong, revoked or
// malformed look the same from outside.
var ErrBadKey = errors.New("missing or invalid API key")

// Authenticate returns the account a key belongs to. The key is compared
// by the hash of its secret, in constant time.
func Authenticate(ctx context.Context, st store.Store, key string) (store.Key, error) {
	id, sec, ok := splitKey(key)
	if !ok {
		return store.Key{}, ErrBadKey
	}
	k, err := st.KeyByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Key{}, ErrBadKey
	}
	if err != nil {
		return store.Key{}, fmt.Errorf("key store: %w", err)
	}
	sum := sha256.Sum256([]byte(sec))
	if subtle.ConstantTimeCompare(sum[:], k.Hash) != 1 || !k.RevokedAt.IsZero() {
		return store.Key{}, ErrBadKey
	}
	return k, nil
}
