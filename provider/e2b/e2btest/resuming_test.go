package e2btest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b/e2btest"
)

// A sandbox being resumed is not yet among E2B's live sandboxes: the
// listing and GET /sandboxes/{id} show it paused from its snapshot record,
// pause answers "already paused", timeout and network 404, envd 502, and a
// connect joins the resume (201, one resume). A kill meanwhile finds no
// live sandbox, deletes the snapshot record and answers 204, and the
// resume still ends with a running sandbox. Checked on the wire.
func TestResumingAsE2BShowsIt(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{TTLCheck: 5 * time.Millisecond, ResumeDelay: 300 * time.Millisecond})
	defer srv.Close()
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.APIURL()+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", srv.APIKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	listed := func(id string) string {
		t.Helper()
		_, b := call(http.MethodGet, "/v2/sandboxes", "")
		var l []struct{ SandboxID, State string }
		if err := json.Unmarshal([]byte(b), &l); err != nil {
			t.Fatal(err)
		}
		for _, x := range l {
			if x.SandboxID == id {
				return x.State
			}
		}
		return "absent"
	}
	detail := func(id string) string {
		t.Helper()
		code, b := call(http.MethodGet, "/sandboxes/"+id, "")
		if code == http.StatusNotFound {
			return "404"
		}
		var d struct{ State string }
		_ = json.Unmarshal([]byte(b), &d)
		return d.State
	}
	envd := func(id string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.SandboxURL()+"/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("Content-Type", "application/json")
		req.SetBasicAuth(srv.User(), "")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	id := srv.CreateSandbox(map[string]string{"k": "v"}, 300, true)
	srv.Pause(id)
	if !srv.Transition(id, "resuming", "running", time.Hour) {
		t.Fatal("Transition resuming refused")
	}
	if sb, _ := srv.Lookup(id); sb.Transition != "resuming" || sb.State != "paused" {
		t.Fatalf("resuming sandbox reads %+v", sb)
	}
	if got := listed(id); got != "paused" {
		t.Errorf("listed %s, want paused", got)
	}
	if got := detail(id); got != "paused" {
		t.Errorf("detail %s, want paused", got)
	}
	if code, b := call(http.MethodPost, "/sandboxes/"+id+"/pause", ""); code != http.StatusConflict || !strings.Contains(b, "already paused") {
		t.Errorf("pause: %d %s, want 409 already paused", code, b)
	}
	if code, _ := call(http.MethodPost, "/sandboxes/"+id+"/timeout", `{"timeout":30}`); code != http.StatusNotFound {
		t.Errorf("timeout: %d, want 404", code)
	}
	if code, _ := call(http.MethodPut, "/sandboxes/"+id+"/network", `{}`); code != http.StatusNotFound {
		t.Errorf("network: %d, want 404", code)
	}
	if code := envd(id); code != http.StatusBadGateway {
		t.Errorf("envd: %d, want 502", code)
	}
	// A connect joins the resume under way.
	if srv.Transition(id, "resuming", "running", 0) {
		t.Error("a second resume of a resuming sandbox was accepted")
	}
	joined := make(chan int, 1)
	go func() {
		code, _ := call(http.MethodPost, "/sandboxes/"+id+"/connect", `{"timeout":30}`)
		joined <- code
	}()
	select {
	case code := <-joined:
		t.Fatalf("connect answered %d during a resume that has an hour left", code)
	case <-time.After(50 * time.Millisecond):
	}
	srv.Close() // the held connect is given up; a fresh fake for the rest
	<-joined

	srv = e2btest.NewServer(e2btest.Options{TTLCheck: 5 * time.Millisecond, ResumeDelay: 300 * time.Millisecond})
	defer srv.Close()
	id = srv.CreateSandbox(map[string]string{"k": "v"}, 300, true)
	srv.Pause(id)
	first := make(chan int, 1)
	go func() {
		code, _ := call(http.MethodPost, "/sandboxes/"+id+"/connect", `{"timeout":30}`)
		first <- code
	}()
	deadline := time.Now().Add(5 * time.Second)
	for sb, _ := srv.Lookup(id); sb.Transition != "resuming"; sb, _ = srv.Lookup(id) {
		if time.Now().After(deadline) {
			t.Fatal("the connect did not start a resume")
		}
		time.Sleep(time.Millisecond)
	}
	code, _ := call(http.MethodPost, "/sandboxes/"+id+"/connect", `{"timeout":30}`)
	if code != http.StatusCreated || <-first != http.StatusCreated {
		t.Fatalf("joined connect %d, want 201 as the resume's", code)
	}
	if sb, _ := srv.Lookup(id); sb.Resumes != 1 || sb.State != "running" || envd(id) != http.StatusOK {
		t.Fatalf("after the joined connects: %+v (envd %d), want one resume, running", sb, envd(id))
	}

	// A kill during a resume removes the snapshot record; the resume goes on.
	srv.Pause(id)
	srv.Transition(id, "resuming", "running", 200*time.Millisecond)
	if code, _ := call(http.MethodDelete, "/sandboxes/"+id, ""); code != http.StatusNoContent {
		t.Fatalf("kill during a resume: %d, want 204", code)
	}
	if got, d := listed(id), detail(id); got != "absent" || d != "404" {
		t.Fatalf("after the kill: listed %s, detail %s; want absent, 404", got, d)
	}
	deadline = time.Now().Add(5 * time.Second)
	for listed(id) != "running" {
		if time.Now().After(deadline) {
			t.Fatal("the resume did not go on after the kill")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
