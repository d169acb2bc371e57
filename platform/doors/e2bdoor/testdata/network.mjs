// network.mjs: E2B's network settings through its SDK (e2b@2.51.0) against
// the door: create's network, Sandbox.updateNetwork, and what an allow list
// cannot say. The sandboxes are left for network_test.go to read their
// policies, and destroyed by it.
import { Sandbox, ALL_TRAFFIC } from 'e2b'
import { call, done } from './nodesdk.mjs'

async function thrown(fn) {
  try { await fn(); return { threw: false } } catch (e) { return { threw: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e) } }
}
const ids = {}
await call('create with network', async () => {
  const s = await Sandbox.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['10.9.8.7'] } })
  ids.a = s.sandboxId
  return s.sandboxId
})
await call('create open', async () => { const s = await Sandbox.create(); ids.b = s.sandboxId; return s.sandboxId })
await call('update partial deny', () => thrown(() => Sandbox.updateNetwork(ids.b, { denyOut: ['10.0.0.0/8'] })))
await call('update', async () => { await Sandbox.updateNetwork(ids.b, { allowInternetAccess: false, allowOut: ['10.1.2.3:443'] }); return true })
await call('update unknown', () => thrown(() => Sandbox.updateNetwork('no-such-sandbox', { allowInternetAccess: false })))
await call('create bad entry', () => thrown(() => Sandbox.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['http://x.example/'] } })))
done()
