// Package mcpserver serves managoat's sandboxes as Model Context Protocol
// tools.
package mcpserver

import _ "github.com/modelcontextprotocol/go-sdk/mcp"
