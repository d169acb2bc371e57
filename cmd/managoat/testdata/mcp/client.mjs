// client.mjs: the official TypeScript MCP client against managoat's MCP
// server, over stdio (MODE=stdio: runs MANAGOAT_BIN mcp) or Streamable
// HTTP (MODE=http: MCP_URL with MCP_KEY; OTHER_KEY is another account's).
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { call, done } from './nodesdk.mjs'

const env = process.env
function transport(key) {
  if (env.MODE === 'stdio') {
    return new StdioClientTransport({ command: env.MANAGOAT_BIN, args: ['mcp'], env: { ...process.env }, stderr: 'inherit' })
  }
  return new StreamableHTTPClientTransport(new URL(env.MCP_URL), { requestInit: { headers: { Authorization: 'Bearer ' + key } } })
}
const structured = r => {
  if (r.isError) throw new Error('tool error: ' + r.content.map(c => c.text).join(''))
  return r.structuredContent
}

const client = new Client({ name: 'managoat-test', version: '1.0.0' })
const tr = transport(env.MCP_KEY)
await call('initialize', () => client.connect(tr), () => client.getServerVersion())
await call('list tools', () => client.listTools(), r => r.tools.map(t => t.name))
const sb = await call('create', () => client.callTool({ name: 'sandbox_create', arguments: {} }), structured)
const name = sb && sb.structuredContent && sb.structuredContent.name
await call('python', () => client.callTool({ name: 'run', arguments: { sandbox: name, argv: ['python3', '-c', 'print(6*7)'] } }), structured)
await call('write', () => client.callTool({ name: 'file_write', arguments: { sandbox: name, path: 'notes/a.txt', content: 'from node\n' } }), structured)
await call('read', () => client.callTool({ name: 'file_read', arguments: { sandbox: name, path: 'notes/a.txt' } }), structured)
const progress = []
await call('stream', () => client.callTool({ name: 'run', arguments: { sandbox: name, shell: 'for i in 1 2 3; do echo line$i; sleep 0.3; done' } },
  undefined, { onprogress: p => progress.push(p.message || '') }), r => ({ result: structured(r), progress }))
await call('unknown field', () => client.callTool({ name: 'run', arguments: { sandbox: name, argv: ['true'], nope: 1 } }),
  r => ({ isError: r.isError, text: r.content.map(c => c.text).join('') }))
await call('list', () => client.callTool({ name: 'sandbox_list', arguments: {} }), structured)
await call('destroy', () => client.callTool({ name: 'sandbox_destroy', arguments: { sandbox: name } }), structured)
if (env.OTHER_KEY) {
  // Another account's key on this session: refused.
  const other = new Client({ name: 'other', version: '1.0.0' })
  const otr = new StreamableHTTPClientTransport(new URL(env.MCP_URL), { sessionId: tr.sessionId, requestInit: { headers: { Authorization: 'Bearer ' + env.OTHER_KEY } } })
  await call('other account', async () => { await otr.start(); return otr.send({ jsonrpc: '2.0', id: 99, method: 'tools/call', params: { name: 'sandbox_list', arguments: {} } }) })
  const bad = new Client({ name: 'bad', version: '1.0.0' })
  await call('bad key', () => bad.connect(new StreamableHTTPClientTransport(new URL(env.MCP_URL),
    { requestInit: { headers: { Authorization: 'Bearer mgk_0000000000000000_wrong' } } })))
}
await call('close', () => client.close())
done()
