package main

import (
	"crypto/sha256"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// servedAccount starts `managoat serve` (with flags) on a fresh home with
// one account and its key, creates sandbox box through it, and returns
// the environment that reaches it and a files API client.
func servedAccount(t *testing.T, flags ...string) (as []string, files func(method, path string, body io.Reader) (int, string)) {
	t.Helper()
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Fatalf("account create: %s", e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "me")
	if code != 0 {
		t.Fatalf("key create: %s", e)
	}
	key = strings.TrimSpace(key)
	startServeCmd(t, base, addr, flags...)
	as = append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) { // serve is starting
		_, e, code := managoatEnv(t, as, "create", "box")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create box: %d %s", code, e)
		}
	}
	t.Cleanup(func() { managoatEnv(t, as, "rm", "-f", "box") })
	files = func(method, path string, body io.Reader) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+"/v1/sandboxes/box/files?path="+url.QueryEscape(path), body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	return as, files
}

func passwdSum(t *testing.T) [32]byte {
	t.Helper()
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestFilesAPIAndCpAgreeOnTmp: through the platform, the files API
// (PUT/GET /v1/sandboxes/NAME/files) and `managoat cp` reach the same
// /tmp, the sandbox's own (not the host's): what one writes the other
// reads, and exec sees both. A write aimed at /etc/passwd is refused and
// the host's file is unchanged.
func TestFilesAPIAndCpAgreeOnTmp(t *testing.T) {
	testenv.RequireRoot(t)
	passwd := passwdSum(t)
	as, files := servedAccount(t)
	dir := "/tmp/managoat-files-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() {
		if passwdSum(t) != passwd {
			t.Errorf("THE HOST'S /etc/passwd CHANGED")
		}
	})

	// cp in, the files API out.
	host := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(host, []byte("copied in by cp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, e, code := managoatEnv(t, as, "exec", "box", "--", "mkdir", "-p", dir); code != 0 {
		t.Fatalf("mkdir: %s", e)
	}
	if _, e, code := managoatEnv(t, as, "cp", host, "box:"+dir+"/in.txt"); code != 0 {
		t.Fatalf("cp into /tmp: %s", e)
	}
	if code, body := files("GET", dir+"/in.txt", nil); code != http.StatusOK || body != "copied in by cp\n" {
		t.Errorf("GET what cp put in /tmp: %d %q", code, body)
	}
	// The files API in, cp and exec out.
	if code, body := files("PUT", dir+"/made/by-api.txt", strings.NewReader("put through the API\n")); code != http.StatusNoContent {
		t.Fatalf("PUT %s/made/by-api.txt: %d %s", dir, code, body)
	}
	out := filepath.Join(t.TempDir(), "out.txt")
	if _, e, code := managoatEnv(t, as, "cp", "box:"+dir+"/made/by-api.txt", out); code != 0 {
		t.Fatalf("cp out of /tmp: %s", e)
	}
	if b, _ := os.ReadFile(out); string(b) != "put through the API\n" {
		t.Errorf("cp out of what the API put: %q", b)
	}
	if o, e, code := managoatEnv(t, as, "exec", "box", "--", "cat", dir+"/made/by-api.txt"); code != 0 || o != "put through the API\n" {
		t.Errorf("exec cat of what the API put: exit %d %q %s", code, o, e)
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Errorf("the host has %s: the sandbox's /tmp is its own", dir)
	}
	if code, body := files("GET", dir+"/none", nil); code != http.StatusNotFound {
		t.Errorf("GET a missing /tmp file: %d %s, want 404", code, body)
	}
	// The host's /etc/passwd, by the routes a caller could try.
	for _, p := range []string{"/etc/passwd", "/proc/self/root/etc/passwd", "/home/sprite/../../etc/passwd", "../../etc/passwd"} {
		if code, body := files("PUT", p, strings.NewReader("evil::0:0::/:/bin/sh\n")); code < 400 || code >= 500 {
			t.Errorf("PUT %s: %d %s, want a 4xx refusal", p, code, body)
		}
	}
	if code, body := files("PUT", "/etc/passwd", strings.NewReader("x")); !strings.Contains(body, "permission_denied") {
		t.Errorf("PUT /etc/passwd: %d %s, want permission_denied (the sandbox's user may not write it)", code, body)
	}
}

// TestFilesAPIOutsideTheHomeRefusedOnTrusted: with serve on the trusted
// mechanism (no isolation: a sandbox's commands are this host's), the
// files API refuses a path outside the home and says why, and the host's
// file is untouched; the home still works.
func TestFilesAPIOutsideTheHomeRefusedOnTrusted(t *testing.T) {
	testenv.RequireRoot(t)
	passwd := passwdSum(t)
	_, files := servedAccount(t, "--mechanism", "trusted")
	canary := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(canary, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, body := files("PUT", canary, strings.NewReader("through the API\n"))
	if b, _ := os.ReadFile(canary); string(b) != "host\n" {
		t.Fatalf("PUT of a host path under trusted wrote the host's file: %q", b)
	}
	if code != http.StatusBadRequest || !strings.Contains(body, "mechanism trusted does not isolate") {
		t.Fatalf("PUT %s under trusted: %d %s, want 400 saying trusted does not isolate", canary, code, body)
	}
	for _, p := range []string{"/etc/passwd", "/proc/self/root/etc/passwd"} {
		if code, body := files("PUT", p, strings.NewReader("evil::0:0::/:/bin/sh\n")); code != http.StatusBadRequest {
			t.Errorf("PUT %s under trusted: %d %s, want 400", p, code, body)
		}
		if code, body := files("GET", p, nil); code != http.StatusBadRequest {
			t.Errorf("GET %s under trusted: %d %.200s, want 400", p, code, body)
		}
	}
	if passwdSum(t) != passwd {
		t.Fatal("THE HOST'S /etc/passwd CHANGED")
	}
	if code, body := files("PUT", "/home/sprite/ok.txt", strings.NewReader("home\n")); code != http.StatusNoContent {
		t.Errorf("PUT in the home under trusted: %d %s", code, body)
	}
	if code, body := files("GET", "/home/sprite/ok.txt", nil); code != http.StatusOK || body != "home\n" {
		t.Errorf("GET in the home under trusted: %d %q", code, body)
	}
}
