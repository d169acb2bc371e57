package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// previewURL asks the platform (MANAGOAT_URL, MANAGOAT_API_KEY) for a
// preview link a browser opens to port of the sandbox name
// (POST /v1/sandboxes/{name}/preview): `managoat url --preview PORT`.
func previewURL(ctx context.Context, name string, port int, ttl time.Duration) (api.PreviewURL, error) {
	var v api.PreviewURL
	key := platformKey()
	if key == "" {
		return v, sandbox.Invalid("preview", "a preview link comes from a platform: set MANAGOAT_URL and MANAGOAT_API_KEY")
	}
	body, _ := json.Marshal(api.PreviewRequest{Port: port, TTLSeconds: int(ttl / time.Second)})
	req, err := http.NewRequestWithContext(ctx, "POST", strings.TrimRight(defaultedPlatformURL(), "/")+"/v1/sandboxes/"+url.PathEscape(name)+"/preview", bytes.NewReader(body))
	if err != nil {
		return v, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return v, sandbox.Unavailable("platform", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return v, sandbox.Unavailable("platform", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error *api.Error `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != nil {
			return v, fmt.Errorf("%s: %s", e.Error.Kind, e.Error.Message)
		}
		return v, fmt.Errorf("the platform answered %s", resp.Status)
	}
	return v, json.Unmarshal(b, &v)
}
