package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
)

// TestServeDaytonaDoor runs Daytona's SDK (@daytonaio/sdk@0.218.0, the
// door's script platform/doors/daytonadoor/testdata/door.mjs) against a
// real `managoat serve` on jail sandboxes, DAYTONA_API_URL at its /daytona
// and DAYTONA_API_KEY a managoat key; every call the script makes must
// end as the door's own TestSDK asserts in full (the calls meant to throw
// throw), and a sandbox the SDK makes is a row of `managoat ls`.
func TestServeDaytonaDoor(t *testing.T) {
	testenv.RequireRoot(t)
	sdk := nodesdk.Setup(t, "@daytonaio/sdk@0.218.0")
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "daytona-user"); code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	kout, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "daytona-user", "--label", "daytona")
	if code != 0 || !strings.HasPrefix(kout, "mgk_") {
		t.Fatalf("key create: %d %q %s", code, kout, e)
	}
	key := strings.TrimSpace(kout)
	startServe(t, base, addr)
	door := "http://" + addr + "/daytona"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) { // serve is starting
		req, _ := http.NewRequest("GET", door+"/sandbox", nil)
		req.Header.Set("Authorization", "Bearer "+key)
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
	}
	res := sdk.Run(t, "../../platform/doors/daytonadoor/testdata/door.mjs", nodesdk.Options{
		Env: map[string]string{"DAYTONA_API_URL": door, "DAYTONA_API_KEY": key}, Timeout: 3 * time.Minute,
	})
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
	if !res.Done || res.ExitCode != 0 {
		t.Fatalf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	for name, want := range map[string]string{
		"exec cwd": `{"exitCode":0,"result":"cwdtest\n"}`, "exec env": `{"exitCode":0,"result":"from-env\n"}`,
	} {
		if got := string(res.Call(t, name).Raw); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	for _, name := range []string{"get missing", "create duplicate", "exec timeout"} {
		if c := res.Call(t, name); c.OK {
			t.Errorf("%s did not throw: %s", name, c.Raw)
		}
	}
	// A sandbox made through the door is a row of `managoat ls` until its
	// delete through the door.
	req, _ := http.NewRequest("POST", door+"/sandbox", strings.NewReader(`{"name":"from-daytona"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("create through the door: %v %v", resp, err)
	}
	resp.Body.Close()
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || !strings.Contains(out, "from-daytona") {
		t.Errorf("ls after a door create: %d %q %s", code, out, e)
	}
	req, _ = http.NewRequest("DELETE", door+"/sandbox/from-daytona", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Errorf("delete through the door: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || strings.Contains(out, "from-daytona") {
		t.Errorf("ls after the delete: %d %q %s", code, out, e)
	}
	// The CLI's --label reaches the platform's record too.
	if _, e, code := managoatEnv(t, as, "create", "--label", "team=ml", "labelled"); code != 0 {
		t.Fatalf("create --label through serve: %d %s", code, e)
	}
	defer managoatEnv(t, as, "rm", "-f", "labelled")
	if out, e, code := managoatEnv(t, as, "ls", "--json"); code != 0 || !strings.Contains(out, `"team":"ml"`) {
		t.Errorf("ls --json after create --label through serve: %d %q %s", code, out, e)
	}
}
