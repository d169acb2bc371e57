package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// handler is one tool's typed work: In is decoded from the arguments
// (validated against its schema, unknown fields refused), Out is the
// structured result.
type handler[In, Out any] func(ctx context.Context, req *mcp.CallToolRequest, st *session, in In) (Out, error)

// addTool registers a tool whose input and output schemas are derived
// from In and Out (descriptions from their jsonschema tags; a struct's
// additionalProperties is false). A call's arguments are checked against
// the input schema, then decoded strictly; the result is the structured
// Out and the same JSON as text; an error is errorResult's. Nothing a
// handler does can crash the server: a panic becomes an internal error.
func addTool[In, Out any](s *Server, name, desc string, h handler[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: tool %s input schema: %v", name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: tool %s output schema: %v", name, err))
	}
	resolved, err := in.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: tool %s input schema: %v", name, err))
	}
	s.tools = append(s.tools, name)
	s.mcp.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: in, OutputSchema: out},
		func(ctx context.Context, req *mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
			defer func() {
				if p := recover(); p != nil {
					s.log.Error("mcp tool panicked", "tool", name, "panic", p)
					res, err = errorResult(refuse(KindInternal, "panic", "the server failed on this call (%v); the session goes on", p)), nil
				}
			}()
			args := req.Params.Arguments
			if len(args) > s.maxArgs {
				return errorResult(refuse(KindLimit, "arguments", "the arguments are %d bytes, more than the %d a call may carry", len(args), s.maxArgs)), nil
			}
			if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
				args = []byte("{}")
			}
			var raw any
			if err := json.Unmarshal(args, &raw); err != nil {
				return errorResult(refuse(KindInvalid, "arguments", "the arguments are not JSON: %v", err)), nil
			}
			if err := resolved.Validate(raw); err != nil {
				return errorResult(refuse(KindInvalid, "arguments", "the arguments do not match %s's input schema: %v", name, err)), nil
			}
			var v In
			dec := json.NewDecoder(bytes.NewReader(args))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&v); err != nil {
				msg := err.Error()
				if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
					return errorResult(refuse(KindInvalid, "unknown_field", "unknown field %s: %s takes only the fields of its input schema", f, name)), nil
				}
				return errorResult(refuse(KindInvalid, "arguments", "%s: %v", name, err)), nil
			}
			st, err := s.session(ctx, req)
			if err != nil {
				return errorResult(toolError(err, "")), nil
			}
			release, err := st.acquire(ctx)
			if err != nil {
				return errorResult(toolError(err, "")), nil
			}
			defer release()
			o, err := h(ctx, req, st, v)
			if err != nil {
				return errorResult(toolError(err, "")), nil
			}
			b, err := json.Marshal(o)
			if err != nil {
				return errorResult(refuse(KindInternal, "marshal", "%v", err)), nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil
		})
}
