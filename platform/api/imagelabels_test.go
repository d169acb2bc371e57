package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// imageRunner is provider/fake that says it runs images, without suspend (a park destroys), recording the
// options of every Create.
type imageRunner struct {
	*fake.Provider
	mu    sync.Mutex
	asked []sandbox.CreateOptions
}

func (p *imageRunner) RunsImages() bool { return true }

func (p *imageRunner) Capabilities() sandbox.Capabilities {
	return p.Provider.Capabilities().Without(sandbox.CapSuspend)
}

func (p *imageRunner) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	p.mu.Lock()
	p.asked = append(p.asked, o)
	p.mu.Unlock()
	return p.Provider.Create(ctx, name, o)
}

func (p *imageRunner) images() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, o := range p.asked {
		out = append(out, o.Image)
	}
	return out
}

// TestImageAndLabels: a create's image goes to the provider and stays on
// the record (GET, list), and a wake from a park by destroy creates the
// sandbox from it again; labels are kept, returned and filtered on; a
// provider that chooses its own images, and labels past their bounds,
// are refused naming the field.
func TestImageAndLabels(t *testing.T) {
	ctx := context.Background()
	ir, plain := &imageRunner{Provider: fake.New()}, fake.New()
	t.Cleanup(func() { _ = ir.Provider.Close(); _ = plain.Close() })
	pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}, Providers: map[string]sandbox.Provider{"fake": ir}})
	key := pl.Account(t, "alice")
	// A provider that chooses its own images is refused one.
	other := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}, Providers: map[string]sandbox.Provider{"fake": plain}})
	if a := call(t, "POST", other.URL+"/v1/sandboxes", other.Account(t, "bob"), strings.NewReader(`{"name": "f", "image": "debian:12"}`)); a.status != 400 || a.err == nil || a.err.Field != "image" {
		t.Errorf("an image on a provider that runs none = %d %s", a.status, a.body)
	}
	if names, _ := plain.ListAllNames(ctx); len(names) != 0 {
		t.Errorf("the refused create made %v", names)
	}

	a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "img", "image": "debian:12", "labels": {"team": "ml", "env": "dev"}}`))
	if a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	var v api.Sandbox
	if err := json.Unmarshal(a.body, &v); err != nil || v.Image != "debian:12" || v.Labels["team"] != "ml" || v.Labels["env"] != "dev" {
		t.Fatalf("create's answer: %+v %v", v, err)
	}
	if got := ir.images(); len(got) != 1 || got[0] != "debian:12" {
		t.Fatalf("the provider was asked for images %q, want [debian:12]", got)
	}
	a = call(t, "GET", pl.URL+"/v1/sandboxes/img", key, nil)
	if err := json.Unmarshal(a.body, &v); err != nil || a.status != 200 || v.Image != "debian:12" || v.Labels["team"] != "ml" {
		t.Fatalf("get = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "plain", "labels": {"team": "web"}}`)); a.status != 201 {
		t.Fatalf("create plain = %d %s", a.status, a.body)
	}
	list := func(q string) []api.Sandbox {
		t.Helper()
		a := call(t, "GET", pl.URL+"/v1/sandboxes"+q, key, nil)
		var l struct {
			Data []api.Sandbox `json:"data"`
		}
		if err := json.Unmarshal(a.body, &l); err != nil || a.status != 200 {
			t.Fatalf("list%s = %d %s", q, a.status, a.body)
		}
		return l.Data
	}
	if l := list(""); len(l) != 2 || l[0].Image != "debian:12" || l[0].Labels["env"] != "dev" || l[1].Image != "" || l[1].Labels["team"] != "web" {
		t.Fatalf("list = %+v", l)
	}
	for q, want := range map[string]string{"?label=team=ml": "img", "?label=team=web": "plain", "?label=team=ml&label=env=dev": "img", "?label=team=x": "", "?label=env=dev&label=team=web": ""} {
		var names []string
		for _, s := range list(q) {
			names = append(names, s.Name)
		}
		if strings.Join(names, ",") != want {
			t.Errorf("list%s = %v, want %q", q, names, want)
		}
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes?label=nokv", key, nil); a.status != 400 || a.err == nil || a.err.Field != "label" {
		t.Errorf("list ?label=nokv = %d %s", a.status, a.body)
	}

	// Parked by destroy, woken by a use: created again from its image.
	acct, _ := pl.Store.AccountByName(ctx, "alice")
	rec, err := pl.Store.GetSandbox(ctx, acct.ID, "img")
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = pl.API.Park(ctx, rec, time.Now().Add(time.Hour)); err != nil || rec.ParkedBy != store.ParkDestroy {
		t.Fatalf("park: %+v %v", rec, err)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes/img/exec", key, strings.NewReader(`{"cmd": "emit", "args": ["out:awake"]}`)); a.status != 200 {
		t.Fatalf("exec in parked img = %d %s", a.status, a.body)
	}
	if got := ir.images(); len(got) != 3 || got[2] != "debian:12" { // img, plain, img again
		t.Fatalf("the wake asked for images %q, want debian:12 again", got)
	}

	// Refusals, each naming its field.
	many := map[string]string{}
	for i := range api.MaxLabels + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	for body, field := range map[string]string{
		`{"name": "f", "image": "debian 12"}`:                                "image",
		`{"name": "f", "labels": ` + string(manyJSON) + `}`:                  "labels",
		`{"name": "f", "labels": {"bad key": "v"}}`:                          "labels",
		`{"name": "f", "labels": {"": "v"}}`:                                 "labels",
		`{"name": "f", "labels": {"k": "` + strings.Repeat("v", 257) + `"}}`: "labels",
	} {
		a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(body))
		if a.status != 400 || a.err == nil || a.err.Field != field {
			t.Errorf("create %.80s = %d %s, want 400 on %s", body, a.status, a.body, field)
		}
	}
	if l := list(""); len(l) != 2 {
		t.Errorf("a refused create left a record: %+v", l)
	}
}
