package daytonatest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// do sends one authorized request and returns status and body.
func (s *Server) do(t *testing.T, method, url, body string, hdr http.Header) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.APIKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	r, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, b
}

// TestJournalModelsTheDaemonsWrapper pins the log the daemon's wrapper
// writes (one marker per line, a newline added to the last partial line,
// NULs dropped, nothing of a line before its newline) and the marker
// stripping without X-Daytona-Split-Output.
func TestJournalModelsTheDaemonsWrapper(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, b := s.do(t, "POST", s.URL+"/sandbox", `{"name":"j"}`, nil)
	if st != 200 {
		t.Fatalf("create: %d %s", st, b)
	}
	sb, _ := s.Lookup("j")
	tb := s.proxyURL(sb.Target) + sb.ID
	if st, b := s.do(t, "POST", tb+"/process/session", `{"sessionId":"s1"}`, nil); st != 201 {
		t.Fatalf("session: %d %s", st, b)
	}
	script, _ := json.Marshal(`printf 'a\000b\nhalf'; sleep 0.3; printf 'f\n' >&2; printf 'tail'`)
	st, b = s.do(t, "POST", tb+"/process/session/s1/exec", `{"command":`+string(script)+`,"runAsync":true}`, nil)
	if st != 202 {
		t.Fatalf("exec: %d %s", st, b)
	}
	var id struct {
		CmdID string `json:"cmdId"`
	}
	_ = json.Unmarshal(b, &id)
	logs := tb + "/process/session/s1/command/" + id.CmdID + "/logs"
	split := http.Header{"X-Daytona-Split-Output": {"true"}}
	time.Sleep(150 * time.Millisecond)
	if _, j := s.do(t, "GET", logs, "", split); string(j) != "\x01\x01\x01ab\n" {
		t.Fatalf("mid-line journal %q: a partial line must not show", j)
	}
	deadline := time.Now().Add(5 * time.Second)
	want := "\x01\x01\x01ab\n\x02\x02\x02f\n\x01\x01\x01halftail\n"
	var j []byte
	for time.Now().Before(deadline) {
		if _, j = s.do(t, "GET", logs, "", split); string(j) == want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if string(j) != want {
		t.Fatalf("journal %q, want %q", j, want)
	}
	if _, j := s.do(t, "GET", logs, "", nil); bytes.ContainsAny(j, "\x01\x02") || string(j) != "ab\nf\nhalftail\n" {
		t.Fatalf("journal without the header %q", j)
	}
	if st, _ := s.do(t, "DELETE", tb+"/process/session/s1", "", nil); st != 204 || s.Sessions("j") != 0 {
		t.Fatalf("delete session: %d, %d left", st, s.Sessions("j"))
	}
}
