package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
)

// TestServeSpritesDoor runs Fly's Sprites SDK (@fly/sprites@0.1.0, the
// door's script platform/doors/spritesdoor/testdata/door.mjs) against a
// real `managoat serve` on jail sandboxes, the client's baseURL at its
// /sprites and its token a managoat key; every call must succeed (the
// door's own TestSDK asserts each result in full), and a sprite the SDK
// makes is a row of `managoat ls`.
func TestServeSpritesDoor(t *testing.T) {
	testenv.RequireRoot(t)
	sdk := nodesdk.Setup(t, "@fly/sprites@0.1.0")
	rt, err := nodesdk.Find()
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(rt.Node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)")
	probe.Env = append(os.Environ(), "NODE_OPTIONS=--experimental-websocket")
	out, perr := probe.CombinedOutput()
	testenv.Require(t, perr == nil, fmt.Sprintf("@fly/sprites needs a Node with a global WebSocket: %v %s", perr, out))
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "sprites-user"); code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	kout, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "sprites-user", "--label", "sprites")
	if code != 0 || !strings.HasPrefix(kout, "mgk_") {
		t.Fatalf("key create: %d %q %s", code, kout, e)
	}
	key := strings.TrimSpace(kout)
	startServe(t, base, addr)
	door := "http://" + addr + "/sprites"
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", door+"/v1/sprites", nil)
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
		time.Sleep(100 * time.Millisecond) // serve is starting
	}
	res := sdk.Run(t, "../../platform/doors/spritesdoor/testdata/door.mjs", nodesdk.Options{
		Env:     map[string]string{"SPRITES_URL": door, "SPRITES_TOKEN": key, "FS_BASE": "/home/sprite", "NODE_OPTIONS": "--experimental-websocket"},
		Timeout: 3 * time.Minute,
	})
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
	if !res.Done || res.ExitCode != 0 {
		t.Fatalf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	// A sprite made through the door is a row of `managoat ls`, and its
	// delete through the door removes the row.
	req, _ := http.NewRequest("POST", door+"/v1/sprites", strings.NewReader(`{"name":"from-the-door"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("create through the door: %v %v", resp, err)
	}
	resp.Body.Close()
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || !strings.Contains(out, "from-the-door") {
		t.Errorf("ls after a door create: %d %q %s", code, out, e)
	}
	req, _ = http.NewRequest("DELETE", door+"/v1/sprites/from-the-door", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Errorf("delete through the door: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if out, e, code := managoatEnv(t, as, "ls"); code != 0 || strings.Contains(out, "from-the-door") {
		t.Errorf("ls after the delete: %d %q %s", code, out, e)
	}
}
