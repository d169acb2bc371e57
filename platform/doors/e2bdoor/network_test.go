package e2bdoor_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// TestNetworkThroughTheSDK: E2B's network settings on create and through
// Sandbox.updateNetwork become the platform's allow list, read back from
// the local provider's state (the policy the sandbox's egress filter is
// given); what an allow list cannot say is refused and changes nothing; a
// create whose policy is refused leaves no sandbox.
func TestNetworkThroughTheSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, "e2b@2.51.0")
	dir := t.TempDir()
	url, key, p := startIn(t, dir)
	cl, err := client.New(client.Options{URL: p.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res := sdk.Run(t, "testdata/network.mjs", nodesdk.Options{
		Env: map[string]string{"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": key}, Timeout: 2 * time.Minute,
	})
	var made []string
	for _, n := range []string{"create with network", "create open"} {
		var id string
		res.Call(t, n).Value(t, &id)
		made = append(made, id)
	}
	defer func() {
		for _, id := range made {
			_ = cl.Destroy(context.Background(), &sandbox.Handle{Provider: client.Name, Name: id})
		}
	}()
	if !res.Done || res.ExitCode != 0 {
		t.Fatalf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	refused := func(name, want string) {
		t.Helper()
		var r struct {
			Threw   any    `json:"threw"`
			Message string `json:"message"`
		}
		res.Call(t, name).Value(t, &r)
		if r.Threw == false || !strings.Contains(r.Message, want) {
			t.Errorf("%s: %+v, want a refusal saying %q", name, r, want)
		}
	}
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
	var updated bool
	if res.Call(t, "update").Value(t, &updated); !updated {
		t.Error("updateNetwork did not return")
	}
	refused("update partial deny", "allow list")
	refused("update unknown", "not found")
	refused("create bad entry", "allow entry")
	var policies []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "policy.json" {
			b, _ := os.ReadFile(path)
			policies = append(policies, string(b))
		}
		return nil
	})
	slices.Sort(policies)
	if want := []string{`["10.1.2.3:443"]`, `["10.9.8.7"]`}; !reflect.DeepEqual(policies, want) {
		t.Errorf("policies in force %q, want %q (create's allowOut, then the update's; the refused update changed nothing)", policies, want)
	}
	list, err := cl.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Errorf("%d sandboxes after the refused create, want the 2 made: %v", len(list), list)
	}
}
