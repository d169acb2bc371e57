package lifecycle_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// callOn sends a request to the platform pl and sends its answer.
func (e *env) callOn(pl *apitest.Platform, method, path, body string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(method, pl.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- fmt.Sprint(resp.StatusCode, " ", string(b))
	}()
	return ch
}

// onProvider reports whether the fake provider holds the sandbox of
// provider name pname.
func (e *env) onProvider(pname string) bool {
	_, err := e.f.Provider.Get(context.Background(), sandbox.BuildHandle("fake", pname))
	return err == nil
}

// TestGetDuringASlowCreateKeepsTheRecord: a GET of a sandbox whose create
// is still under way on its provider (more than 10 s: a hosted provider's
// create can take that) keeps the record. The provider says not found
// until its create lands; GET took that for a sandbox gone and deleted
// the record under the create, whose answer was then an error while the
// sandbox it made lived on the provider with no record.
func TestGetDuringASlowCreateKeepsTheRecord(t *testing.T) {
	e := setup(t, false)
	g := newGate(t)
	e.f.setHook(&e.f.onCreate, g.wait)
	created := e.callOn(e.pl, "POST", "/v1/sandboxes", `{"name": "slow"}`)
	await(t, g.in, "the create never reached its provider")
	e.later(11 * time.Second)
	code, body := e.call("GET", "/v1/sandboxes/slow", "")
	if code != 200 || !strings.Contains(body, `"state":"creating"`) {
		t.Errorf("GET during the create: %d %s; want 200, state creating", code, body)
	}
	g.open()
	if got := await(t, created, "the create never answered"); !strings.HasPrefix(got, "201 ") {
		t.Fatalf("the create: %s", got)
	}
	rec := e.rec("slow")
	if rec.State != store.StateRunning || !e.onProvider(rec.ProviderName) {
		t.Fatalf("after the create: record %+v, on the provider %v", rec, e.onProvider(rec.ProviderName))
	}
}
