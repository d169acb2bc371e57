package runner_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
)

// dialAs connects a raw runner socket named name with key; it returns the
// HTTP status of a refusal (0 when connected).
func dialAs(t *testing.T, pl *platform, name, key string) int {
	t.Helper()
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	return 0
}

// TestRunnersAreWhoTheySay: with enrolled runners (RunnerFile), the
// platform's client key connects no runner; a runner's credential connects
// it under its own name only; after a DELETE, an impostor still cannot
// take the name; a rotated credential replaces the old one.
func TestRunnersAreWhoTheySay(t *testing.T) {
	file := filepath.Join(t.TempDir(), "runners.json")
	pl := newPlatform(t, prov.ServerConfig{RunnerAuth: prov.RunnerFile{Path: file}})
	laptop, err := prov.Enroll(file, "laptop", "local", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prov.Enroll(file, "laptop", "local", false); !errors.Is(err, prov.ErrAlreadyEnrolled) {
		t.Fatalf("enrolling a name twice: %v", err)
	}
	if _, err := prov.Enroll(file, "Not Valid", "local", false); err == nil {
		t.Fatal("an invalid name was enrolled")
	}
	other, err := prov.Enroll(file, "other", "local", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, key string
	}{
		{"laptop", token}, // the client key
		{"evil", token},   // the client key, a new name
		{"laptop", other}, // another runner's credential
		{"laptop", ""},    // none
		{"laptop", laptop + "x"},
	} {
		if got := dialAs(t, pl, c.name, c.key); got != http.StatusUnauthorized {
			t.Errorf("runner %q with key %.8q...: %d, want 401", c.name, c.key, got)
		}
	}
	if len(pl.host.Online()) != 0 {
		t.Fatalf("a refused runner is online: %+v", pl.host.Online())
	}
	if got := dialAs(t, pl, "laptop", laptop); got != 0 {
		t.Fatalf("the enrolled runner was refused: %d", got)
	}
	id := pl.online(t)
	// Deleted, its name is still its own.
	req, _ := http.NewRequest(http.MethodDelete, pl.ts.URL+prov.ListPath+"/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	pl.offline(t)
	if got := dialAs(t, pl, "laptop", token); got != http.StatusUnauthorized {
		t.Fatalf("an impostor with the client key after a delete: %d, want 401", got)
	}
	rotated, err := prov.Enroll(file, "laptop", "local", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := dialAs(t, pl, "laptop", laptop); got != http.StatusUnauthorized {
		t.Fatalf("the credential replaced by rotation: %d, want 401", got)
	}
	if got := dialAs(t, pl, "laptop", rotated); got != 0 {
		t.Fatalf("the rotated credential: %d", got)
	}
	if err := prov.Revoke(file, "laptop"); err != nil {
		t.Fatal(err)
	}
}

// TestPlacementOnlyAmongTheCallersRunners: the runner list a client places
// sandboxes among holds its own account's runners only.
func TestPlacementOnlyAmongTheCallersRunners(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{Auth: prov.AuthFunc(func(_ *http.Request, key string) (string, error) {
		switch key {
		case "key-a", token:
			return "acct-a", nil
		case "key-b":
			return "acct-b", nil
		}
		return "", prov.ErrUnauthorized
	})})
	if got := dialAs(t, pl, "a-runner", "key-a"); got != 0 {
		t.Fatalf("dial: %d", got)
	}
	pl.online(t)
	ctx := context.Background()
	for key, want := range map[string]int{"key-a": 1, "key-b": 0} {
		cl := prov.NewClient(pl.ts.URL, key)
		rs, err := cl.Runners(ctx)
		cl.Close()
		if err != nil || len(rs) != want {
			t.Errorf("%s sees %+v (%v), want %d runners", key, rs, err, want)
		}
	}
	cl := prov.NewClient(pl.ts.URL, "key-b")
	defer cl.Close()
	if _, err := prov.NewProvider(cl, prov.ProviderOptions{}).Mint(ctx); err == nil {
		t.Fatal("account b was given account a's runner")
	}
}

// TestEnrolledIDIsRandomAndKept: an enrolled runner's id is made at
// random at its enrolment (not StableID of its account and name, which
// anyone who can name the runner computes), a rotation keeps it, and the
// same name enrolled anew (another file: another platform) gets another.
// Fails on the old code: the id was StableID("local", "laptop").
func TestEnrolledIDIsRandomAndKept(t *testing.T) {
	file := filepath.Join(t.TempDir(), "runners.json")
	pl := newPlatform(t, prov.ServerConfig{RunnerAuth: prov.RunnerFile{Path: file}})
	cred, err := prov.Enroll(file, "laptop", "local", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := dialAs(t, pl, "laptop", cred); got != 0 {
		t.Fatalf("dial: %d", got)
	}
	id := pl.online(t)
	if id == prov.StableID("local", "laptop") {
		t.Fatalf("the enrolled runner's id %s is derived from its account and name", id)
	}
	if _, err := prov.Parse(prov.NamePrefix + strings.ReplaceAll(id, "-", "") + "-0"); err != nil {
		t.Fatalf("id %s does not route sandbox names: %v", id, err)
	}
	pl.host.Delete(id)
	pl.offline(t)
	rotated, err := prov.Enroll(file, "laptop", "local", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := dialAs(t, pl, "laptop", rotated); got != 0 {
		t.Fatalf("dial with the rotated credential: %d", got)
	}
	if again := pl.online(t); again != id {
		t.Fatalf("id after a rotation %s, want %s kept", again, id)
	}
	other := filepath.Join(t.TempDir(), "runners.json")
	if _, err := prov.Enroll(other, "laptop", "local", false); err != nil {
		t.Fatal(err)
	}
	_, id2, err := prov.RunnerFile{Path: other}.IdentifyRunner(nil, "wrong", "laptop")
	if err == nil {
		t.Fatalf("a wrong credential was identified as %s", id2)
	}
	if a, b := prov.NewRunnerID(), prov.NewRunnerID(); a == b {
		t.Fatalf("two random ids are equal: %s", a)
	}
}
