package e2btest_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/e2b/e2btest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A pause stops the sandbox's processes and cuts their streams; a connect
// continues them. Checked on the wire, without the provider.
func TestPauseStopsAndConnectContinues(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{})
	defer srv.Close()
	id := srv.CreateSandbox(nil, 300, true)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	req, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "sh", "args": []string{"-c", "echo $$; exec sleep 30"}}, "tag": "t1"})
	body := append([]byte{0, 0, 0, 0, 0}, req...)
	binary.BigEndian.PutUint32(body[1:], uint32(len(req)))
	r, _ := http.NewRequest("POST", srv.SandboxURL()+"/process.Process/Start", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/connect+json")
	r.Header.Set("E2b-Sandbox-Id", id)
	resp, err := client.Do(r)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Start: %v %v", resp, err)
	}
	defer resp.Body.Close()
	next := func() (byte, string, error) {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			return 0, "", err
		}
		p := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		_, err := io.ReadFull(resp.Body, p)
		return hdr[0], string(p), err
	}
	var pid int
	for pid == 0 {
		_, msg, err := next()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(msg, `"start"`) {
			var ev struct {
				Event struct{ Start struct{ Pid int } }
			}
			_ = json.Unmarshal([]byte(msg), &ev)
			pid = ev.Event.Start.Pid
		}
	}
	state := func() string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return "gone"
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return f[0]
	}
	waitState := func(want string) {
		deadline := time.Now().Add(5 * time.Second)
		for state() != want {
			if time.Now().After(deadline) {
				t.Fatalf("process state %s, want %s", state(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	srv.Pause(id)
	waitState("T")
	// The stream was cut with the VM's snapshot: it ends without an end event.
	for {
		_, msg, err := next()
		if err != nil {
			break
		}
		if strings.Contains(msg, `"end"`) {
			t.Fatalf("end event after a pause: %s", msg)
		}
	}
	c, _ := http.NewRequest("POST", srv.APIURL()+"/sandboxes/"+id+"/connect", strings.NewReader(`{"timeout":300}`))
	c.Header.Set("X-API-Key", srv.APIKey())
	cr, err := client.Do(c)
	if err != nil || cr.StatusCode != 201 {
		t.Fatalf("connect: %v %v", cr, err)
	}
	cr.Body.Close()
	waitState("S")
	if !srv.Kill(id) {
		t.Fatal("kill")
	}
	waitState("gone")
}

// The listing decodes a metadata filter as E2B does: the parameter, then
// the whole value, then each key and value.
func TestMetadataFilterDecoding(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{})
	defer srv.Close()
	want := srv.CreateSandbox(map[string]string{"k&=": "a+b %2F c"}, 300, true)
	srv.CreateSandbox(map[string]string{"k&=": "other"}, 300, true)
	get := func(filter string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.APIURL()+"/v2/sandboxes?metadata="+url.QueryEscape(filter), nil)
		req.Header.Set("X-API-Key", srv.APIKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	pair := url.QueryEscape("k&=") + "=" + url.QueryEscape("a+b %2F c")
	if code, body := get(url.QueryEscape(pair)); code != 200 || !strings.Contains(body, want) || strings.Count(body, "sandboxID") != 1 {
		t.Fatalf("triple-encoded filter: %d %s", code, body)
	}
	if code, _ := get("k=v=w"); code != 400 {
		t.Fatalf("a pair with two '=' = %d, want 400", code)
	}
}

// A sandbox changing state is shown as E2B's listing and detail show it
// (e2b-dev/infra handlers sandboxes_list.go, sandbox_get.go, sandbox_pause.go,
// orchestrator keep_alive.go), checked on the wire.
func TestTransitionsAsE2BShowsThem(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{TTLCheck: 5 * time.Millisecond})
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
	fresh := srv.CreateSandbox(map[string]string{"k": "fresh"}, 300, true)
	once := srv.CreateSandbox(map[string]string{"k": "once"}, 300, true)
	srv.Pause(once)
	srv.Resume(once) // its snapshot record stays

	rows := []struct {
		state                string
		id                   string
		wantList, wantDetail string
	}{
		{"snapshotting", fresh, "absent", "running"},
		{"snapshotting", once, "paused", "running"},
		{"pausing", fresh, "paused", "paused"},
		{"killing", fresh, "absent", "404"},
		{"killing", once, "paused", "404"},
	}
	for _, r := range rows {
		srv.Transition(r.id, r.state, "running", time.Hour)
		if got := listed(r.id); got != r.wantList {
			t.Errorf("%s (ever paused: %v): listed %s, want %s", r.state, r.id == once, got, r.wantList)
		}
		if got := detail(r.id); got != r.wantDetail {
			t.Errorf("%s (ever paused: %v): detail %s, want %s", r.state, r.id == once, got, r.wantDetail)
		}
		if code, _ := call(http.MethodPost, "/sandboxes/"+r.id+"/timeout", `{"timeout":30}`); code != http.StatusConflict {
			t.Errorf("%s: timeout answered %d, want 409", r.state, code)
		}
		srv.Transition(r.id, r.state, "running", 0)
		deadline := time.Now().Add(5 * time.Second)
		for detail(r.id) != "running" || listed(r.id) != "running" {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not end", r.state)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Pause waits out a snapshot and pauses after it; refuses a sandbox
	// being killed; answers 409 for one already paused.
	srv.Transition(fresh, "snapshotting", "running", 100*time.Millisecond)
	if code, b := call(http.MethodPost, "/sandboxes/"+fresh+"/pause", ""); code != http.StatusNoContent || detail(fresh) != "paused" {
		t.Fatalf("pause during a snapshot: %d %s, then %s", code, b, detail(fresh))
	}
	if code, b := call(http.MethodPost, "/sandboxes/"+fresh+"/pause", ""); code != http.StatusConflict || !strings.Contains(b, "already paused") {
		t.Fatalf("pause of a paused sandbox: %d %s", code, b)
	}
	for _, path := range []string{"/timeout", "/network"} {
		method := http.MethodPost
		if path == "/network" {
			method = http.MethodPut
		}
		if code, _ := call(method, "/sandboxes/"+fresh+path, `{"timeout":30}`); code != http.StatusNotFound {
			t.Fatalf("%s of a paused sandbox: %d, want 404", path, code)
		}
	}
	srv.Transition(once, "killing", "", time.Hour)
	if code, b := call(http.MethodPost, "/sandboxes/"+once+"/pause", ""); code != http.StatusConflict || !strings.Contains(b, "killing") {
		t.Fatalf("pause of a sandbox being killed: %d %s", code, b)
	}
}
