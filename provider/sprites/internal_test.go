package sprites

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

func TestEscapeSegment(t *testing.T) {
	for in, want := range map[string]string{
		"owned worker/x": "owned%20worker%2Fx",
		"a-b_c.d~e":      "a-b_c.d~e",
		"x:y@z&q=1+2$":   "x%3Ay%40z%26q%3D1%2B2%24",
		"é":              "%C3%A9",
	} {
		if got := escapeSegment(in); got != want {
			t.Errorf("escapeSegment(%q) = %q, want %q", in, got, want)
		}
	}
	p := &Provider{}
	if got := p.spritePath("owned worker/x", "checkpoint"); got != "/v1/sprites/owned%20worker%2Fx/checkpoint" {
		t.Fatal(got)
	}
}

type panicRT struct{}

func (panicRT) RoundTrip(*http.Request) (*http.Response, error) { panic("boom: " + "secret detail") }

// TestBoundedPanic: a panic inside the request is the operation's
// transport_failed, with no detail.
func TestBoundedPanic(t *testing.T) {
	p, err := New(Config{Token: "t", BaseURL: "http://127.0.0.1:1", CheckpointCreationEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	p.bounded = panicRT{}
	ctx := context.Background()
	h := sandbox.BuildHandle(ProviderName, "x")
	want := func(err error, reason string) {
		t.Helper()
		var u *sandbox.UnavailableError
		if !errors.As(err, &u) || u.Reason != reason || u.Err != nil || strings.Contains(err.Error(), "secret") {
			t.Fatalf("err = %v, want Unavailable{%s} without detail", err, reason)
		}
	}
	_, err = p.CreateNew(ctx, "x", sandbox.CreateNewOptions{})
	want(err, ReasonCreateTransportFailed)
	want(p.DestroyOnce(ctx, h, sandbox.DestroyOnceOptions{}), ReasonDeleteTransportFailed)
	want(p.TerminateSession(ctx, h, "1", sandbox.TerminateOptions{}), ReasonTerminationTransport)
	_, err = p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op"})
	want(err, ReasonCheckpointTransport)
}

func TestPolicyRules(t *testing.T) {
	r := policyRules(sandbox.NetworkPolicy{})
	if len(r) != 1 || r[0]["domain"] != "*" || r[0]["action"] != "deny" || len(r[0]) != 2 {
		t.Fatalf("deny-all = %v", r)
	}
	r = policyRules(sandbox.NetworkPolicy{Allow: []string{"b.example", "a.example"}})
	if len(r) != 2 || r[0]["domain"] != "b.example" || r[1]["domain"] != "a.example" || r[0]["action"] != "allow" || r[1]["action"] != "allow" {
		t.Fatalf("allow = %v", r)
	}
}

func TestMapStatus(t *testing.T) {
	for s, want := range map[string]sandbox.Status{"running": sandbox.StatusRunning, "ready": sandbox.StatusRunning,
		"active": sandbox.StatusRunning, "suspended": sandbox.StatusSuspended, "paused": sandbox.StatusSuspended,
		"stopped": sandbox.StatusSuspended, "warm": sandbox.StatusUnknown, "cold": sandbox.StatusUnknown,
		"migrating": sandbox.StatusUnknown, "": sandbox.StatusUnknown} {
		if got := mapStatus(s); got != want {
			t.Errorf("mapStatus(%q) = %s, want %s", s, got, want)
		}
	}
}

// TestBoundedHTTP1: against a TLS server that offers HTTP/2, the bounded
// operations still speak HTTP/1.1, ask for no compression, and follow no
// redirect.
func TestBoundedHTTP1(t *testing.T) {
	var protos []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos = append(protos, r.Proto+" "+r.Header.Get("Accept-Encoding")+" "+r.Header.Get("Connection"))
		w.Header().Set("Location", "/v1/sprites/elsewhere")
		w.WriteHeader(http.StatusFound)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	p, err := New(Config{Token: "t", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	tr := p.bounded.(*http.Transport)
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	_, err = p.CreateNew(context.Background(), "x", sandbox.CreateNewOptions{})
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || iv.HTTP == nil || iv.HTTP.Status != 302 {
		t.Fatalf("err = %v, want Invalid{http 302}", err)
	}
	if len(protos) != 1 || protos[0] != "HTTP/1.1  close" {
		t.Fatalf("requests seen: %q", protos)
	}
}
