// door.mjs: a program for @daytonaio/sdk@0.218.0 against managoat's
// Daytona front door; DAYTONA_API_URL and DAYTONA_API_KEY come from the test.
import { Daytona } from '@daytonaio/sdk'
import { call, done } from './nodesdk.mjs'

const daytona = new Daytona()
const info = s => ({ id: s.id, name: s.name, state: s.state, labels: s.labels })
const res = r => ({ exitCode: r.exitCode, result: r.result })

const sbx = await call('create', () => daytona.create({ name: 'door-a', labels: { suite: 'door', role: 'a' }, envVars: { DOOR_CREATED: 'yes' } }), info)
await call('create other', () => daytona.create({ name: 'door-b', labels: { suite: 'other' } }), info)
await call('create duplicate', () => daytona.create({ name: 'door-a' }))
await call('get', () => daytona.get('door-a'), info)
await call('get missing', () => daytona.get('door-missing'))
await call('list labels', async () => {
  const names = []
  for await (const s of daytona.list({ labels: { suite: 'door' } })) names.push(s.name)
  return names.sort()
})
await call('list all', async () => {
  const names = []
  for await (const s of daytona.list()) names.push(s.name)
  return names.sort()
})
await call('exec exit', () => sbx.process.executeCommand('echo hi; echo oops >&2; exit 3'), res)
await call('exec created env', () => sbx.process.executeCommand('echo "$DOOR_CREATED"'), res)
await call('exec cwd', async () => {
  await sbx.process.executeCommand('mkdir -p cwdtest')
  return sbx.process.executeCommand('basename "$(pwd)"', 'cwdtest')
}, res)
await call('exec env', () => sbx.process.executeCommand('echo "$SDK_VAR"', undefined, { SDK_VAR: 'from-env' }), res)
await call('exec timeout', () => sbx.process.executeCommand('sleep 20', undefined, undefined, 1))
await call('setLabels', () => sbx.setLabels({ suite: 'door', role: 'relabelled' }))
await call('list relabelled', async () => {
  const names = []
  for await (const s of daytona.list({ labels: { role: 'relabelled' } })) names.push(s.name)
  return names
})
await call('stop', async () => { await sbx.stop(); return sbx.state })
await call('get stopped', () => daytona.get('door-a'), s => s.state)
await call('start', async () => { await sbx.start(); return sbx.state })
await call('exec after start', () => sbx.process.executeCommand('echo back'), res)
await call('bad key', () => new Daytona({ apiKey: 'mgk_bad', apiUrl: process.env.DAYTONA_API_URL }).get('door-a'))
await call('delete', async () => { await sbx.delete(); return true })
await call('get deleted', () => daytona.get('door-a'))
await call('delete other', async () => { await (await daytona.get('door-b')).delete(); return true })
done()
process.exit(0)
