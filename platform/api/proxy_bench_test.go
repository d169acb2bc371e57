package api_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkProxy compares a request to an application through the
// platform's proxy (authentication, the record, the provider's address,
// ReverseProxy) with the same request straight to the application, in
// one run: small is a GET of 2 bytes (x-direct: the proxied time over the
// direct one), download a GET of 8 MiB (proxy-MiB/s and direct-MiB/s,
// and x-direct the ratio of their times).
//
//	go test -run XXX -bench Proxy ./platform/api/
func BenchmarkProxy(b *testing.B) {
	big := bytes.Repeat([]byte("x"), 8<<20)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(big)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	b.Cleanup(app.Close)
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	pub := &publisher{Provider: f, addr: app.Listener.Addr().String(), ports: map[string][]int{}}
	pl := apitest.Start(b, apitest.Options{Providers: map[string]sandbox.Provider{"fake": pub}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"},
		Configure: func(c *api.Config) { c.Rate = 1e6 }})
	key := pl.Account(b, "bench")
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.Cleanup(hc.CloseIdleConnections)
	get := func(url string, auth bool) int64 {
		req, _ := http.NewRequest("GET", url, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode)
		}
		return n
	}
	req, _ := http.NewRequest("POST", pl.URL+"/v1/sandboxes", strings.NewReader(`{"name": "web", "publish": [8080]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 201 {
		b.Fatal(resp, err)
	}
	resp.Body.Close()
	proxied, direct := pl.URL+"/v1/sandboxes/web/ports/8080", "http://"+pub.addr
	measure := func(b *testing.B, path string) {
		var viaProxy, straight time.Duration
		var bytes int64
		for b.Loop() {
			t0 := time.Now()
			bytes += get(proxied+path, true)
			t1 := time.Now()
			get(direct+path, false)
			viaProxy, straight = viaProxy+t1.Sub(t0), straight+time.Since(t1)
		}
		b.ReportMetric(float64(viaProxy)/float64(straight), "x-direct")
		if path == "/big" {
			mib := float64(bytes) / (1 << 20)
			b.ReportMetric(mib/viaProxy.Seconds(), "proxy-MiB/s")
			b.ReportMetric(mib/straight.Seconds(), "direct-MiB/s")
		}
	}
	b.Run("small", func(b *testing.B) { measure(b, "/") })
	b.Run("download", func(b *testing.B) { measure(b, "/big") })
}
