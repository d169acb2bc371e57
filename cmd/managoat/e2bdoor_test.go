package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
)

// TestServeE2BDoor runs E2B's SDK (e2b@2.51.0, the door's script
// platform/doors/e2bdoor/testdata/door.mjs) against a real `managoat
// serve` on jail sandboxes, E2B_API_URL and E2B_SANDBOX_URL at its /e2b
// and E2B_API_KEY a managoat key; every call must succeed with the result
// the door's own TestSDK asserts in full (a few are checked here), and a
// sandbox the SDK makes is a row of `managoat ls`.
func TestServeE2BDoor(t *testing.T) {
	testenv.RequireRoot(t)
	sdk := nodesdk.Setup(t, "e2b@2.51.0")
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "e2b-user"); code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "e2b-user", "--label", "e2b")
	if code != 0 || !strings.HasPrefix(out, "mgk_") {
		t.Fatalf("key create: %d %q %s", code, out, e)
	}
	key := strings.TrimSpace(out)
	startServe(t, base, addr)
	door := "http://" + addr + "/e2b"
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", door+"/v2/sandboxes", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the door did not answer: %v %v", resp, err)
		}
		time.Sleep(100 * time.Millisecond) // serve is starting
	}
	res := sdk.Run(t, "../../platform/doors/e2bdoor/testdata/door.mjs", nodesdk.Options{
		Env:     map[string]string{"E2B_API_URL": door, "E2B_SANDBOX_URL": door, "E2B_API_KEY": key, "E2B_USER_HOME": "/home/sprite"},
		Timeout: 3 * time.Minute,
	})
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
		if !c.OK {
			t.Errorf("%s threw %s", c.Name, c.Err())
		}
	}
	if !res.Done || res.ExitCode != 0 {
		t.Fatalf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	for name, want := range map[string]string{
		"run":         `{"exitCode":0,"stdout":"out\nfrom-create\n","stderr":"err\n","streamedOut":"out\nfrom-create\n","streamedErr":"err\n"}`,
		"run nonzero": `{"isExit":true,"exitCode":3,"stdout":"partial\n"}`,
		"read text":   `"hello, world\n"`, "read bytes": `true`, "kill": `true`, "kill again": `false`,
	} {
		if got := string(res.Call(t, name).Raw); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	// A sandbox made through the door is a row of `managoat ls`, and its
	// kill through the door removes the row.
	req, _ := http.NewRequest("POST", door+"/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var made struct{ SandboxID string }
	_ = json.NewDecoder(resp.Body).Decode(&made)
	resp.Body.Close()
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || made.SandboxID == "" || !strings.Contains(out, made.SandboxID) {
		t.Errorf("ls after a door create of %q: %d %q %s", made.SandboxID, code, out, e)
	}
	req, _ = http.NewRequest("DELETE", door+"/sandboxes/"+made.SandboxID, nil)
	req.Header.Set("X-API-Key", key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 204 {
		t.Errorf("kill through the door: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || strings.Contains(out, made.SandboxID) {
		t.Errorf("ls after the kill: %d %q %s", code, out, e)
	}
}
