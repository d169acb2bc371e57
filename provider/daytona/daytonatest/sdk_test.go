package daytonatest_test

import (
	"encoding/json"
	"net"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/provider/daytona/daytonatest"
)

// SDK is the vendor's client the fake is checked against.
const SDK = "@daytonaio/sdk@0.218.0"

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestSDK runs sdk/daytona.mjs, written from the SDK's public API only,
// against the fake playing each generation, and asserts every call's
// result: the fake serves what @daytonaio/sdk@0.218.0 sends.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, SDK)
	for _, gen := range []daytonatest.Generation{daytonatest.Current, daytonatest.Daemon0190} {
		t.Run(gen.String(), func(t *testing.T) {
			srv, err := daytonatest.New()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			srv.Generation = gen
			port := freePort(t)
			res := sdk.Run(t, "sdk/daytona.mjs", nodesdk.Options{Env: map[string]string{
				"DAYTONA_API_URL": srv.URL, "DAYTONA_API_KEY": srv.APIKey,
				"SDK_PREVIEW_PORT": strconv.Itoa(port), "SDK_PREFIX": "sdk",
			}, Timeout: 3 * time.Minute})
			checkDaytonaSDK(t, srv, res)
			if t.Failed() {
				for _, c := range res.Calls {
					t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
				}
			}
		})
	}
}

func checkDaytonaSDK(t *testing.T, srv *daytonatest.Server, res *nodesdk.Result) {
	t.Helper()
	if res.ExitCode != 0 || !res.Done {
		for _, c := range res.Calls {
			t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
		}
		t.Fatalf("script exit %d done %v timed out %v\n%s", res.ExitCode, res.Done, res.TimedOut, tail(res.Stderr))
	}
	eq := func(name string, want any) {
		t.Helper()
		c := res.Call(t, name)
		if !c.OK {
			t.Errorf("%s: threw %s", name, c.Err())
			return
		}
		w, _ := json.Marshal(want)
		var a, b any
		_ = json.Unmarshal(c.Raw, &a)
		_ = json.Unmarshal(w, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s = %s, want %s", name, c.Raw, w)
		}
	}
	threw := func(name, class, msg string) {
		t.Helper()
		c := res.Call(t, name)
		if c.OK {
			t.Errorf("%s: returned %s, want %s", name, c.Raw, class)
			return
		}
		if c.Error.Name != class || !strings.Contains(c.Error.Message, msg) {
			t.Errorf("%s: threw %s, want %s containing %q", name, c.Err(), class, msg)
		}
	}
	// The SDK adds its code-toolbox language label to every create.
	labelsA := map[string]string{"suite": "sdk", "role": "a", "code-toolbox-language": "python"}
	var created struct {
		ID, Name, State string
		Labels          map[string]string
		Toolbox         bool
	}
	res.Call(t, "create").Value(t, &created)
	sb, ok := byID(srv, created.ID)
	if !ok || created.ID != sb.ID || created.Name != "sdk-a" || created.State != "started" || !created.Toolbox ||
		!reflect.DeepEqual(created.Labels, labelsA) {
		t.Errorf("create = %+v (fake has %+v)", created, sb)
	}
	if env, _ := sb.Create["env"].(map[string]any); env["SDK_CREATED"] != "yes" {
		t.Errorf("create sent env %v", sb.Create["env"])
	}
	var other struct{ ID string }
	res.Call(t, "create other").Value(t, &other)
	eq("create other", map[string]any{"id": other.ID, "name": "sdk-b", "state": "started", "labels": map[string]string{"suite": "sdk-other", "code-toolbox-language": "python"}, "toolbox": true})
	threw("create duplicate", "DaytonaConflictError", "already exists")
	want := map[string]any{"id": created.ID, "name": "sdk-a", "state": "started", "labels": created.Labels, "toolbox": true}
	eq("get", want)
	eq("get by id", want)
	threw("get missing", "DaytonaNotFoundError", "")
	eq("list labels", []string{"sdk-a"})

	eq("exec exit", map[string]any{"exitCode": 3, "result": "hi\noops\n"})
	eq("exec cwd", map[string]any{"exitCode": 0, "result": filepath.Join(srv.Root(), created.ID, "home", "cwdtest") + "\n"})
	eq("exec env", map[string]any{"exitCode": 0, "result": "from-env\n"})
	threw("exec timeout", "DaytonaTimeoutError", "timed out")

	eq("createSession", nil)
	eq("getSession", map[string]any{"sessionId": "s1", "commands": 0})
	eq("session sync", map[string]any{"exitCode": 4, "stdout": "out\n", "stderr": "err\n", "output": "out\nerr\n", "cmdId": "string"})
	eq("session async", map[string]any{"cmdId": "string", "exitCode": nil})
	eq("session logs streaming", map[string]any{"stdout": "line1\nline2\nline3\n", "stderr": "tail\n"})
	eq("session logs", map[string]any{"output": "line1\nline2\nline3\ntail\n", "stdout": "line1\nline2\nline3\n", "stderr": "tail\n"})
	// The sync command's streams raced into its journal; both are whole.
	var logs struct{ Output, Stdout, Stderr string }
	res.Call(t, "session logs sync command").Value(t, &logs)
	if logs.Stdout != "out\n" || logs.Stderr != "err\n" || len(logs.Output) != len("out\nerr\n") ||
		!strings.Contains(logs.Output, "out\n") || !strings.Contains(logs.Output, "err\n") {
		t.Errorf("session logs sync command = %+v", logs)
	}
	eq("getSessionCommand", map[string]any{"id": true, "command": "echo out; echo err >&2; exit 4"})
	eq("getSession after", map[string]any{"sessionId": "s1", "commands": []string{"echo out; echo err >&2; exit 4",
		"for i in 1 2 3; do echo line$i; sleep 0.2; done; echo tail >&2"}})
	eq("listSessions", []string{"s1"})
	eq("deleteSession", nil)
	threw("getSession deleted", "DaytonaNotFoundError", "session not found")

	eq("createFolder", "") // the SDK hands back the 201's empty body
	eq("uploadFile", nil)
	eq("uploadFiles", nil)
	b, err := nodesdk.Bytes(res.Call(t, "downloadFile").Raw)
	if err != nil || string(b) != "hello old world\n\x00\xff" {
		t.Errorf("downloadFile = %q, %v", b, err)
	}
	threw("downloadFile missing", "DaytonaNotFoundError", "file not found")
	eq("downloadFiles", []map[string]any{{"source": "work/sub/b.txt", "result": "second old\n", "error": nil},
		{"source": "work/none.txt", "result": nil, "error": "file not found: work/none.txt"}})
	eq("listFiles", []map[string]any{{"name": "a.txt", "isDir": false, "size": 18}, {"name": "c.bin", "isDir": false, "size": 8},
		{"name": "sub", "isDir": true, "size": 4096}})
	eq("getFileDetails", map[string]any{"name": "sub", "isDir": true, "permissions": "0750"})
	eq("searchFiles", []string{"sub/b.txt", "work/a.txt"})
	eq("findFiles", []map[string]any{{"file": "sub/b.txt", "line": 1, "content": "second old"}, {"file": "work/a.txt", "line": 1, "content": "hello old world"}})
	eq("replaceInFiles", []bool{true, true})
	eq("after replace", "second new\n")
	eq("moveFiles", "not text")
	eq("setFilePermissions", "0600")
	eq("deleteFile", []string{"sub"})
	threw("deleteFile dir without recursive", "DaytonaValidationError", "recursive")
	eq("deleteFile recursive", []string{})

	eq("getPreviewLink", map[string]any{"url": "string", "token": "string", "sandboxId": true})
	eq("preview fetch", map[string]any{"status": 200, "body": "preview /hello"})
	eq("preview without token", 401)

	eq("sendSessionCommandInput", "got:typed\n")
	eq("setLabels", map[string]string{"suite": "sdk", "role": "relabelled"})
	eq("list relabelled", []string{"sdk-a"})
	home := filepath.Join(srv.Root(), created.ID, "home")
	eq("getUserHomeDir", home)
	eq("getWorkDir", home)
	eq("setAutostopInterval", 30)

	eq("stop", "stopped")
	eq("get stopped", "stopped")
	eq("start", "started")
	eq("exec after start", "back\n")
	eq("delete", nil)
	threw("get deleted", "DaytonaNotFoundError", "")
	eq("delete other", nil)
	eq("list after delete", []string{})

	// The SDK asked for socket.io state events first and, refused, polled.
	if n := countReq(srv, "GET /api/socket.io/"); n == 0 {
		t.Errorf("no socket.io attempt among %d requests", len(srv.Requests()))
	}
}

func byID(srv *daytonatest.Server, id string) (daytonatest.Sandbox, bool) {
	for _, sb := range srv.Sandboxes() {
		if sb.ID == id {
			return sb, true
		}
	}
	return daytonatest.Sandbox{}, false
}

func countReq(srv *daytonatest.Server, prefix string) int {
	n := 0
	for _, r := range srv.Requests() {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func tail(b []byte) string {
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}
