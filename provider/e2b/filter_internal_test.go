package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/managoat/managoat/provider/e2b/e2btest"
)

// The listing's metadata filter reaches E2B's parseFilters intact for keys
// and values that its decodings would change: the parameter's decoding,
// then the whole value's, then each key's and value's (e2b-dev/infra
// packages/api/internal/utils/sandboxes_list.go). A filter encoded once
// (url.Values.Encode) splits a value with '&' or '=' and loses '+' and
// '%'.
func TestMetadataFilterAsTheAPIDecodesIt(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{})
	defer srv.Close()
	for _, v := range []string{"plain-name.1_x", "a&b=c", "1+1 %2F 50%", "x=y&z", "é/ü?#"} {
		want := srv.CreateSandbox(map[string]string{"k&=+%": v}, 300, true)
		srv.CreateSandbox(map[string]string{"k&=+%": v + "-other"}, 300, true)
		q := url.Values{}
		q.Set("metadata", metadataFilter(url.Values{"k&=+%": {v}}))
		req, _ := http.NewRequest(http.MethodGet, srv.APIURL()+"/v2/sandboxes?"+q.Encode(), nil)
		req.Header.Set("X-API-Key", srv.APIKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got []listed
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil || len(got) != 1 || got[0].id() != want {
			t.Errorf("filter on %q: %d %s, want exactly %s", v, resp.StatusCode, b, want)
		}
	}
}
