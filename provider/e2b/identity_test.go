package e2b_test

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

func stamped(name string) map[string]string {
	return map[string]string{e2b.MetaName: name, e2b.MetaMarker: "1"}
}

func countPosts(srv *e2btest.Server) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/sandboxes" {
			n++
		}
	}
	return n
}

func carrying(srv *e2btest.Server, name string) []e2btest.Sandbox {
	var out []e2btest.Sandbox
	for _, sb := range srv.Sandboxes() {
		if sb.Metadata[e2b.MetaName] == name {
			out = append(out, sb)
		}
	}
	return out
}

func TestIdentity(t *testing.T) {
	cases := []struct {
		name  string
		stage func(srv *e2btest.Server) (want string) // returns the id Create must adopt, "" for a fresh one
		posts int                                     // POST /sandboxes calls Create makes
		left  int                                     // sandboxes carrying the name afterwards
		state string
	}{
		{"fresh", func(*e2btest.Server) string { return "" }, 1, 1, "running"},
		{"adopts running", func(s *e2btest.Server) string { return s.CreateSandbox(stamped("n"), 300, true) }, 0, 1, "running"},
		{"adopts paused without resuming", func(s *e2btest.Server) string {
			id := s.CreateSandbox(stamped("n"), 300, true)
			s.Pause(id)
			return id
		}, 0, 1, "paused"},
		{"picks the oldest of duplicates", func(s *e2btest.Server) string {
			id := s.CreateSandbox(stamped("n"), 300, true)
			s.CreateSandbox(stamped("n"), 300, true)
			return id
		}, 0, 2, "running"},
		{"ignores another name and foreign sandboxes", func(s *e2btest.Server) string {
			s.CreateSandbox(stamped("other"), 300, true)
			s.CreateSandbox(map[string]string{"app": "x"}, 300, true)
			return ""
		}, 1, 1, "running"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, e2btest.Options{}, nil)
			want := tc.stage(e.srv)
			e.srv.ResetRequests()
			h, err := e.p.Create(ctx(t), "n", sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want != "" && h.Private != want {
				t.Fatalf("adopted %v, want %s", h.Private, want)
			}
			if got := countPosts(e.srv); got != tc.posts {
				t.Fatalf("%d creates, want %d", got, tc.posts)
			}
			left := carrying(e.srv, "n")
			if len(left) != tc.left {
				t.Fatalf("%d sandboxes carry the name, want %d", len(left), tc.left)
			}
			if left[0].ID != h.Private || left[0].State != tc.state {
				t.Fatalf("canonical %s (%s), handle %v; want state %s", left[0].ID, left[0].State, h.Private, tc.state)
			}
			// Every later lookup resolves to the same sandbox.
			if info, err := e.p.Get(ctx(t), sandbox.BuildHandle(e2b.Name, "n")); err != nil || !strings.Contains(string(info.Raw), left[0].ID) {
				t.Fatalf("Get = %s, %v", info.Raw, err)
			}
			// Destroy removes every sandbox carrying the name.
			if err := e.p.Destroy(ctx(t), sandbox.BuildHandle(e2b.Name, "n")); err != nil {
				t.Fatal(err)
			}
			if n := len(carrying(e.srv, "n")); n != 0 {
				t.Fatalf("%d left after Destroy", n)
			}
			if _, err := e.p.Get(ctx(t), h); !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("Get after Destroy = %v", err)
			}
		})
	}
}

// Concurrent creates of one name converge to exactly one sandbox.
func TestCreateRaceConverges(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	for round := 0; round < 3; round++ {
		name := "race-" + string(rune('a'+round))
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = e.p.Create(ctx(t), name, sandbox.CreateOptions{})
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := len(carrying(e.srv, name)); n != 1 {
			t.Fatalf("round %d: %d sandboxes carry %s, want 1", round, n, name)
		}
	}
}

func TestCreateStampsAndLists(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	e.srv.ResetRequests()
	e.create("stamp-1")
	var body, query string
	for _, r := range e.srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/sandboxes" {
			body = r.Body
		}
		if r.Path == "/v2/sandboxes" && query == "" {
			query = r.Query
		}
	}
	for _, want := range []string{`"templateID":"base"`, `"timeout":1800`, `"autoPause":true`, `"fountain":"1"`, `"fountain_name":"stamp-1"`} {
		if !strings.Contains(body, want) {
			t.Errorf("create body %s lacks %s", body, want)
		}
	}
	q, _ := url.ParseQuery(query)
	if q.Get("state") != "running,paused" || q.Get("metadata") != "fountain_name%3Dstamp-1" {
		t.Errorf("lookup query %q", query)
	}
}

func TestListAllNamesPagesAndTruncates(t *testing.T) {
	e := newEnv(t, e2btest.Options{MaxPage: 2}, nil)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		e.srv.CreateSandbox(stamped(n), 300, true)
	}
	paused := e.srv.CreateSandbox(stamped("f"), 300, true)
	e.srv.Pause(paused)
	e.srv.CreateSandbox(map[string]string{"app": "foreign"}, 300, true)
	names, err := e.p.ListAllNames(ctx(t))
	if err != nil || strings.Join(names, ",") != "a,b,c,d,e,f" {
		t.Fatalf("ListAllNames = %v, %v", names, err)
	}
	pages := 0
	for _, r := range e.srv.Requests() {
		if r.Path == "/v2/sandboxes" {
			pages++
		}
	}
	if pages != 3 {
		t.Fatalf("%d pages, want 3", pages)
	}

	// The default cap is 40 pages: 41 one-sandbox pages are refused whole.
	e1 := newEnv(t, e2btest.Options{MaxPage: 1}, nil)
	for i := 0; i < 40; i++ {
		e1.srv.CreateSandbox(stamped("p"+strconv.Itoa(i)), 300, true)
	}
	if names, err := e1.p.ListAllNames(ctx(t)); err != nil || len(names) != 40 {
		t.Fatalf("40 pages: %d names, %v", len(names), err)
	}
	e1.srv.CreateSandbox(stamped("p40"), 300, true)
	if names, err := e1.p.ListAllNames(ctx(t)); !errors.Is(err, sandbox.ErrTruncated) || names != nil {
		t.Fatalf("41 pages: %v, %v; want ErrTruncated and no names", names, err)
	}

	short, err := e2b.New(e2b.Config{APIKey: e.srv.APIKey(), APIURL: e.srv.APIURL(), MaxPages: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	if _, err := short.ListAllNames(ctx(t)); !errors.Is(err, sandbox.ErrTruncated) {
		t.Fatalf("ListAllNames past the page cap = %v, want ErrTruncated", err)
	}
}

func TestSuspendResume(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("sr-1")
	id := h.Private.(string)
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	if sb, _ := e.srv.Lookup(id); sb.State != "paused" {
		t.Fatalf("state %s after Suspend", sb.State)
	}
	e.srv.ResetRequests()
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.srv.Requests() {
		if strings.HasSuffix(r.Path, "/pause") {
			t.Fatalf("Suspend of a paused sandbox paused it again")
		}
	}
	r, err := e.p.Resume(ctx(t), sandbox.BuildHandle(e2b.Name, "sr-1"))
	if err != nil || r.Private != id {
		t.Fatalf("Resume = %v, %v", r, err)
	}
	if sb, _ := e.srv.Lookup(id); sb.State != "running" {
		t.Fatalf("state %s after Resume", sb.State)
	}
	// A pause that races another (the listing still said running, E2B
	// answers 409 already paused) is success once a re-read says paused.
	e.srv.Pause(id)
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Status: 200,
		Body: `[{"sandboxID":"` + id + `","state":"running","metadata":{"fountain_name":"sr-1","fountain":"1"}}]`})
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatalf("Suspend with 409 = %v", err)
	}
	for _, f := range []func() error{
		func() error { return e.p.Suspend(ctx(t), sandbox.BuildHandle(e2b.Name, "missing")) },
		func() error { _, err := e.p.Resume(ctx(t), sandbox.BuildHandle(e2b.Name, "missing")); return err },
	} {
		if err := f(); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("on a missing sandbox: %v, want ErrNotFound", err)
		}
	}
}

func TestNetworkPolicy(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("net-1")
	id := h.Private.(string)
	for _, tc := range []struct {
		allow []string
		body  string
	}{
		{nil, `"allowOut":[]`},
		{[]string{}, `"allowOut":[]`},
		{[]string{"api.example.com", "*.example.org"}, `"allowOut":["api.example.com","*.example.org"]`},
	} {
		e.srv.ResetRequests()
		if err := e.p.ApplyNetworkPolicy(ctx(t), h, sandbox.NetworkPolicy{Allow: tc.allow}); err != nil {
			t.Fatal(err)
		}
		sb, _ := e.srv.Lookup(id)
		if sb.Network == nil || strings.Join(sb.Network.DenyOut, ",") != "0.0.0.0/0" ||
			strings.Join(sb.Network.AllowOut, ",") != strings.Join(tc.allow, ",") {
			t.Fatalf("network %+v for allow %v", sb.Network, tc.allow)
		}
		found := false
		for _, r := range e.srv.Requests() {
			if r.Method == "PUT" && strings.Contains(r.Body, tc.body) && strings.Contains(r.Body, `"denyOut":["0.0.0.0/0"]`) {
				found = true
			}
		}
		if !found {
			t.Fatalf("no PUT network with %s", tc.body)
		}
	}
	if _, err := sandbox.NewRegistry(e.p).PublicURL(ctx(t), h); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("PublicURL = %v", err)
	}
}
