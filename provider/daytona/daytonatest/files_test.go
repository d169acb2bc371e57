package daytonatest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/daytona/daytonatest"
)

// TestFileRoutesStayInRoot sends the new file routes paths outside the
// fake's root (absolute, and ../ from the home): each is refused with 403
// and nothing is written, moved or deleted outside.
func TestFileRoutesStayInRoot(t *testing.T) {
	srv, err := daytonatest.New()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	do := func(method, u string, body io.Reader, ctype string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, u, body)
		req.Header.Set("Authorization", "Bearer "+srv.APIKey)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		r, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return r
	}
	r := do("POST", srv.URL+"/sandbox", strings.NewReader(`{"name":"conf"}`), "application/json")
	if r.StatusCode != 200 {
		t.Fatalf("create: %d", r.StatusCode)
	}
	sb, _ := srv.Lookup("conf")
	tb := strings.TrimSuffix(srv.URL, "/api") + "/toolbox/" + sb.ID
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(srv.Home("conf"), outside)
	for _, bad := range []string{filepath.Join(outside, "new"), filepath.Join(rel, "new")} {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		_ = mw.WriteField("files[0].path", bad)
		fw, _ := mw.CreateFormFile("files[0].file", "x")
		_, _ = fw.Write([]byte("evil"))
		_ = mw.Close()
		checks := []struct {
			name string
			r    *http.Response
		}{
			{"bulk-upload", do("POST", tb+"/files/bulk-upload", &buf, mw.FormDataContentType())},
			{"folder", do("POST", tb+"/files/folder?"+url.Values{"path": {bad + "dir"}}.Encode(), nil, "")},
			{"move out", do("POST", tb+"/files/move?"+url.Values{"source": {"."}, "destination": {bad}}.Encode(), nil, "")},
			{"move in", do("POST", tb+"/files/move?"+url.Values{"source": {victim}, "destination": {"stolen"}}.Encode(), nil, "")},
			{"delete", do("DELETE", tb+"/files?"+url.Values{"path": {victim}}.Encode(), nil, "")},
			{"permissions", do("POST", tb+"/files/permissions?"+url.Values{"path": {victim}, "mode": {"777"}}.Encode(), nil, "")},
			{"list", do("GET", tb+"/files?"+url.Values{"path": {outside}}.Encode(), nil, "")},
			{"replace", do("POST", tb+"/files/replace", strings.NewReader(mustJSON(map[string]any{"files": []string{victim}, "pattern": "keep", "newValue": "evil"})), "application/json")},
		}
		for _, c := range checks {
			if c.name == "replace" {
				continue // per-file results; checked below by content
			}
			if c.r.StatusCode != http.StatusForbidden {
				t.Errorf("%s %s: %d, want 403", c.name, bad, c.r.StatusCode)
			}
		}
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Errorf("outside the root now holds %d entries, want only the victim", len(ents))
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Errorf("victim = %q, %v", b, err)
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("victim mode changed: %v, %v", fi.Mode(), err)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
