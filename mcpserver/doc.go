// Package mcpserver serves managoat's sandboxes as Model Context Protocol
// tools, over any sandbox.Registry: the local provider, any provider the
// CLI reaches, the platform's client. It is built on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk); `managoat mcp` serves it over
// stdio, and `managoat serve` over Streamable HTTP at /mcp (cmd/managoat).
//
//	srv, _ := mcpserver.New(mcpserver.Options{Backend: &mcpserver.Backend{Registry: reg, Provider: "local"}})
//	err := srv.Run(ctx, &mcp.StdioTransport{MaxLineLength: mcpserver.MaxArgsBytes + 64<<10})
//
// Tools (input and output JSON schemas are derived from the *Input and
// *Output types here, with descriptions; tools/list shows them):
// sandbox_create, sandbox_destroy, sandbox_list, run, session_read,
// session_kill, file_read, file_write, file_list, file_delete,
// port_publish. A result is structured (structuredContent) and the same
// JSON as text. A failure is a tool error (isError): its text is
// {"error":{"kind","taxonomy","reason","message","retry_after_ms"}} and
// its _meta["managoat/error"] the same object (no structuredContent,
// which clients check against the output schema). Kinds: not_found,
// invalid, limit, policy, timeout, not_supported, unavailable, internal;
// taxonomy is sandbox.Kind of the provider's error.
//
// Sessions: a client session sees only the sandboxes it made (named
// mcp-<session tag>-<4 hex>, labelled managoat.mcp.session=<tag> and
// managoat.mcp.owner=<boot:pid:start> where the provider keeps labels),
// and they are destroyed when the session ends: the client closes it
// (stdin's end on stdio), it idles past Options.Idle (HTTP: the
// transport's SessionTimeout), or the server closes. A server killed
// before it could (SIGKILL) leaves sandboxes whose owner is gone: Sweep,
// which `managoat mcp` runs at start, destroys them.
//
// Inputs: each call's arguments are checked against the tool's schema
// (unknown fields refused) and decoded strictly; paths may not be empty,
// hold NUL or pass 4096 bytes (the provider confines file_read and
// file_write to the sandbox's home); a panic in a tool is an internal
// error, and the session goes on.
//
// Bounds (the constants below): arguments MaxArgsBytes; file_read and
// file_write MaxFileBytes; run keeps at most MaxOutputBytes of stdout and
// of stderr (the rest is read, counted and dropped, and the result says
// truncated), and a command's stream queues at most 2 MiB for this server
// (the providers' producers wait for room, so the command waits, never
// this server's memory); progress notifications wait in at most 64 KiB
// (older output past it is not streamed, the result keeps its copy);
// MaxCallsPerSession calls at once per session, MaxSandboxesPerSession
// sandboxes. A run printing 10 MiB grows the heap of server and an
// in-process client together by under 32 MiB (TestOutputBounded).
//
// run streams output as progress notifications (progress: bytes so far;
// message: the output since the last) when the call has a progress
// token. With detach it starts a detachable session and returns its id;
// session_read reads it from a byte offset, attaching to the provider's
// journal (replay from byte zero, then tail), so nothing is lost.
//
// file_list and file_delete have no operation in the sandbox contract:
// they run a fixed sh script in the sandbox (GNU find's -printf where
// there, else a POSIX loop without sizes), whose output is bounded and
// parsed as hostile.
package mcpserver
