package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testClusterKey is the cluster key of the tests' platforms (48 bytes,
// base64).
const testClusterKey = "dGVzdC1jbHVzdGVyLWtleS10ZXN0LWNsdXN0ZXIta2V5LXRlc3QtY2x1c3Rlci1r"

// TestServeNeedsAClusterKey: serve with --nats (or its variable) and no
// cluster key is refused before it connects, naming how to give one; a
// key file that others may read, a key too short, or a key given twice
// is refused too; no refusal shows the key; serve admin needs none.
func TestServeNeedsAClusterKey(t *testing.T) {
	home := "MANAGOAT_HOME=" + t.TempDir()
	nats := envNATSURL + "=nats://127.0.0.1:1"
	dir := t.TempDir()
	open := filepath.Join(dir, "open.key")
	if err := os.WriteFile(open, []byte(testClusterKey), 0o644); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(dir, "private.key")
	if err := os.WriteFile(private, []byte(testClusterKey), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no key", nil, nil, "--cluster-key-file"},
		{"key file open to others", nil, []string{"--cluster-key-file", open}, "chmod 600"},
		{"key too short", []string{envClusterKey + "=c2hvcnQta2V5"}, nil, "at least 32"},
		{"key given twice", []string{envClusterKey + "=" + testClusterKey}, []string{"--cluster-key-file", private}, "once"},
		{"creds and nkey", []string{envClusterKey + "=" + testClusterKey, envNATSCreds + "=/x", envNATSNKey + "=/y"}, nil, "give one"},
	} {
		args := append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)
		_, e, code := managoatEnv(t, append([]string{home, nats, envClusterKeyFile + "="}, tc.env...), args...)
		if code != exitUsage || !strings.Contains(e, tc.want) || strings.Contains(e, testClusterKey) {
			t.Errorf("%s: exit %d %q, want a usage error saying %q", tc.name, code, e, tc.want)
		}
	}
	// With a good key the replica goes on to connect (nothing listens).
	_, e, code := managoatEnv(t, []string{home, nats}, "serve", "--listen", "127.0.0.1:0", "--cluster-key-file", private)
	if code == 0 || code == exitUsage || !strings.Contains(e, "nats") || strings.Contains(e, testClusterKey) {
		t.Errorf("serve with a key file and no NATS server: exit %d %q, want a failure to connect", code, e)
	}
	// serve admin needs no key.
	if _, e, code := managoatEnv(t, []string{home, nats}, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Errorf("serve admin with %s and no key: exit %d %s", envNATSURL, code, e)
	}
}
