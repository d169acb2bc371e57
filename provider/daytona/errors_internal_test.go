package daytona

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// TestErrorTable covers every row of the contract's HTTP table as Daytona
// answers it (§3.2, §6.3.8), with the retryAfter field's validation.
func TestErrorTable(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		status int
		body   string
		header http.Header
		kind   string
		retry  time.Duration
		detail string
	}{
		{404, `{"statusCode":404,"message":"Sandbox not found"}`, nil, "not_found", 0, ""},
		{401, `{"statusCode":401,"message":"Unauthorized"}`, nil, "denied", 0, "Unauthorized"},
		{403, `{"message":"Forbidden: tier"}`, nil, "denied", 0, "Forbidden: tier"},
		{429, `{"retryAfter":7}`, nil, "rate_limited", 7 * time.Second, ""},
		{429, `{"retryAfter":0}`, nil, "rate_limited", 0, ""},
		{429, `{"retryAfter":-3}`, nil, "rate_limited", 0, ""},
		{429, `{"retryAfter":"7"}`, nil, "rate_limited", 0, ""},
		{429, `{"retryAfter":1.5}`, nil, "rate_limited", 0, ""},
		{429, `{"message":"slow down"}`, nil, "rate_limited", 0, ""},
		{429, `not json`, hdr("Retry-After", "4"), "rate_limited", 4 * time.Second, ""},
		{429, `{"retryAfter":2}`, hdr("Retry-After", "9"), "rate_limited", 9 * time.Second, ""},
		{429, `{"retryAfter":2}`, hdr("Retry-After-Sandbox-Create", "5"), "rate_limited", 5 * time.Second, ""},
		{429, `{}`, hdr("Retry-After-Authenticated", "x"), "rate_limited", 0, ""},
		{429, `{}`, hdr("Retry-After", "-1"), "rate_limited", 0, ""},
		{500, `{"message":"boom"}`, nil, "unavailable", 0, "boom"},
		{502, `<html>bad gateway</html>`, nil, "unavailable", 0, "<html>bad gateway</html>"},
		{503, ``, nil, "unavailable", 0, ""},
		{599, `{}`, nil, "unavailable", 0, ""},
		{400, `{"message":["name must be a string","snapshot not found"]}`, nil, "invalid", 0, "name must be a string; snapshot not found"},
		{409, `{"message":"exists"}`, nil, "invalid", 0, "exists"},
		{418, `{"error":"teapot"}`, nil, "invalid", 0, "teapot"},
		{422, `{}`, nil, "invalid", 0, "{}"},
		{302, ``, hdr("Location", "/elsewhere"), "invalid", 0, ""},
		{204, ``, nil, "invalid", 0, ""},
	} {
		h := tc.header
		if h == nil {
			h = http.Header{}
		}
		err := httpError(&response{status: tc.status, body: []byte(tc.body), header: h})
		if k := sandbox.Kind(err); k != tc.kind {
			t.Errorf("%d %s: kind %s (%v), want %s", tc.status, tc.body, k, err, tc.kind)
			continue
		}
		var rl *sandbox.RateLimitedError
		if errors.As(err, &rl) && rl.RetryAfter != tc.retry {
			t.Errorf("%d %s: retry after %v, want %v", tc.status, tc.body, rl.RetryAfter, tc.retry)
		}
		if tc.kind != "not_found" && tc.kind != "rate_limited" {
			if st := statusOf(err); st != tc.status {
				t.Errorf("%d: statusOf = %d", tc.status, st)
			}
		}
		if tc.detail != "" {
			var d *sandbox.HTTPDetail
			var un *sandbox.UnavailableError
			var iv *sandbox.InvalidError
			var de *sandbox.DeniedError
			switch {
			case errors.As(err, &un):
				d = un.HTTP
			case errors.As(err, &iv):
				d = iv.HTTP
			case errors.As(err, &de):
				d = de.HTTP
			}
			if d == nil || d.Body != tc.detail {
				t.Errorf("%d: detail %v, want body %q", tc.status, d, tc.detail)
			}
		}
	}
	if err := conflictAsUnavailable(httpError(&response{status: 409, body: []byte(`{}`), header: http.Header{}})); sandbox.Kind(err) != "unavailable" {
		t.Errorf("409 from start = %v, want unavailable", err)
	}
	if err := conflictAsUnavailable(httpError(&response{status: 400, body: []byte(`{}`), header: http.Header{}})); sandbox.Kind(err) != "invalid" {
		t.Errorf("400 re-tagged: %v", err)
	}
}
