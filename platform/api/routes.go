package api

import (
	_ "embed"
	"net/http"

	"github.com/managoat/managoat/platform/store"
)

// Route is one route of the API; the OpenAPI document describes exactly
// these (a test checks it).
type Route struct {
	Method, Path string
	Handler      string
	Public       bool // no API key
}

// Routes are the API's routes.
var Routes = []Route{
	{"GET", "/v1/openapi.json", "openapi", true},
	{"GET", "/v1/providers", "providers", false},
	{"GET", "/v1/runners", "runners", false},
	{"POST", "/v1/runners/{runner}/cordon", "runner_cordon", false},
	{"POST", "/v1/runners/{runner}/uncordon", "runner_uncordon", false},
	{"POST", "/v1/runners/{runner}/drain", "runner_drain", false},
	{"POST", "/v1/runners/{runner}/labels", "runner_labels", false},
	{"POST", "/v1/sandboxes", "create", false},
	{"GET", "/v1/sandboxes", "list", false},
	{"GET", "/v1/sandboxes/{name}", "get", false},
	{"DELETE", "/v1/sandboxes/{name}", "destroy", false},
	{"POST", "/v1/sandboxes/{name}/exec", "exec", false},
	{"GET", "/v1/sandboxes/{name}/stream", "stream", false},
	{"GET", "/v1/sandboxes/{name}/sessions", "sessions", false},
	{"POST", "/v1/sandboxes/{name}/sessions/{session}/terminate", "terminate", false},
	{"POST", "/v1/sandboxes/{name}/suspend", "suspend", false},
	{"POST", "/v1/sandboxes/{name}/resume", "resume", false},
	{"PUT", "/v1/sandboxes/{name}/files", "write_file", false},
	{"GET", "/v1/sandboxes/{name}/files", "read_file", false},
	{"PUT", "/v1/sandboxes/{name}/network-policy", "network_policy", false},
	{"GET", "/v1/sandboxes/{name}/url", "url", false},
	{"POST", "/v1/sandboxes/{name}/preview", "preview", false}, // preview.go
	{"GET", "/v1/sandboxes/{name}/previews", "previews", false},
	{"DELETE", "/v1/sandboxes/{name}/previews/{id}", "preview_revoke", false},
	{"GET", "/v1/sandboxes/{name}/ports", "ports", false},
	{"GET", "/v1/sandboxes/{name}/checkpoints", "checkpoints", false},
	{"POST", "/v1/sandboxes/{name}/checkpoints", "checkpoint", false},
	{"POST", "/v1/sandboxes/{name}/checkpoints/{checkpoint}/restore", "restore", false},
	// The proxy to a port the sandbox publishes (proxy.go); {path} is the
	// rest of the path, slashes included. GET serves HEAD too.
	{"GET", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
	{"POST", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
	{"PUT", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
	{"PATCH", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
	{"DELETE", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
	{"OPTIONS", "/v1/sandboxes/{name}/ports/{port}/{path}", "proxy", false},
}

// OpenAPI is the API's OpenAPI 3.1 document, served at GET /v1/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

func (s *Server) openapi(w http.ResponseWriter, _ *http.Request, _ store.Key) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(OpenAPI)
}
