package runner_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	prov "github.com/managoat/managoat/provider/runner"
)

// TestMetaIsOpaque: ServerConfig.Meta gives a runner its application's
// metadata at connection, and the host gets it back untouched in Register's
// connection, Online, Presence (online and offline) and the runner list.
// Fails on the old code: Info had no field of the host's own.
func TestMetaIsOpaque(t *testing.T) {
	var mu sync.Mutex
	var presence []map[string]string
	host := prov.NewLocalHost()
	host.OnPresence = func(i prov.Info, online bool) {
		mu.Lock()
		presence = append(presence, i.Meta)
		mu.Unlock()
	}
	pl := newPlatform(t, prov.ServerConfig{Host: host, Meta: func(r *http.Request, i prov.Info) map[string]string {
		return map[string]string{"tenant": "t-42", "remote": r.Header.Get("X-Test"), "name": i.Name}
	}})
	pl.host = host
	rd, _, err := dialRaw(t, pl, "meta")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	want := map[string]string{"tenant": "t-42", "remote": "", "name": "meta"}
	same := func(m map[string]string) bool {
		b1, _ := json.Marshal(m)
		b2, _ := json.Marshal(want)
		return bytes.Equal(b1, b2)
	}
	if on := host.Online(); len(on) != 1 || !same(on[0].Meta) {
		t.Fatalf("Online = %+v, want meta %v", on, want)
	}
	if c := host.Whereis(id); c == nil || !same(c.Info().Meta) {
		t.Fatalf("the registered connection's meta is not the host's")
	}
	req, _ := http.NewRequest(http.MethodGet, pl.ts.URL+prov.ListPath, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Data []prov.Info }
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || !same(list.Data[0].Meta) {
		t.Fatalf("GET %s = %+v, want meta %v", prov.ListPath, list.Data, want)
	}
	_ = rd.ws.CloseNow()
	pl.offline(t)
	waitFor(t, "presence offline", 5e9, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(presence) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, m := range presence {
		if !same(m) {
			t.Fatalf("presence meta %v, want %v", m, want)
		}
	}
}

// TestMissingHostIsLoud: a Server made without a Host says so in a
// warning naming the option (a cluster that forgot its host would run as
// single nodes); one given a Host says nothing. Fails on the old code: the
// fallback was silent.
func TestMissingHostIsLoud(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	srv := prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken(token), Logger: log})
	srv.Close()
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "ServerConfig.Host") || !strings.Contains(out, "natshost") {
		t.Fatalf("no warning naming the option: %q", out)
	}
	buf.Reset()
	srv = prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken(token), Host: prov.NewLocalHost(), Logger: log})
	srv.Close()
	if buf.Len() != 0 {
		t.Fatalf("a Server with a Host logged: %q", buf.String())
	}
}
