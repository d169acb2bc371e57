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
