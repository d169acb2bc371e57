package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// envServeSecret names the file of serve's secret, which signs preview
// links and keys the dashboard's CSRF tokens; envPreviewDomain the DNS
// name under which each preview gets a host of its own (default
// localhost, which browsers resolve to loopback; a deployment sets a
// wildcard name of its own).
const (
	envServeSecret   = "MANAGOAT_SERVE_SECRET_FILE"
	envPreviewDomain = "MANAGOAT_PREVIEW_DOMAIN"
)

// serveSecret reads serve's secret from path, making it (32 random
// bytes, 0600, this user's) when it does not exist. It is never written
// to the records: a tenant reads no row that holds it. Replicas of one
// platform share the file (MANAGOAT_SERVE_SECRET_FILE), or a link one
// made is refused by another.
func serveSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) < 32 {
			return nil, fmt.Errorf("serve secret %s: %d bytes, want 32 or more", path, len(b))
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("serve secret: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("serve secret: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return serveSecret(path) // another serve made it first
	}
	if err != nil {
		return nil, fmt.Errorf("serve secret: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("serve secret: %w", err)
	}
	return b, f.Close()
}
