// door.mjs: a program for @fly/sprites@0.1.0 run against managoat's
// Sprites front door; each call's result is reported through nodesdk's
// helper and asserted by door_test.go. SPRITES_URL and SPRITES_TOKEN are
// the client's baseURL and token; FS_BASE is the filesystem's working
// directory inside the sprite.
import { SpritesClient } from '@fly/sprites'
import { call, done } from './nodesdk.mjs'

const client = new SpritesClient(process.env.SPRITES_TOKEN, { baseURL: process.env.SPRITES_URL })
const info = s => ({ name: s.name, status: s.status, id: typeof s.id })
const sleep = ms => new Promise(r => setTimeout(r, ms))
const failed = e => ({ name: e.constructor.name, exitCode: e.exitCode, stdout: e.stdout, stderr: e.stderr })
const apiErr = e => ({ name: e.name, status: e.statusCode, code: e.errorCode })

const sprite = await call('create', () => client.createSprite('door-a'), info)
await call('create other', () => client.createSprite('door-b'), info)
await call('create duplicate', async () => { try { return await client.createSprite('door-a') } catch (e) { return apiErr(e) } })
await call('get', () => client.getSprite('door-a'), info)
await call('get missing', async () => { try { return await client.getSprite('door-missing') } catch (e) { return apiErr(e) } })
await call('list', () => client.listSprites({ prefix: 'door-' }), r => ({ names: r.sprites.map(s => s.name), hasMore: r.hasMore }))
await call('list paged', async () => {
  const first = await client.listSprites({ prefix: 'door-', maxResults: 1 })
  const second = await client.listSprites({ prefix: 'door-', maxResults: 1, continuationToken: first.nextContinuationToken })
  return [first.sprites.map(s => s.name), first.hasMore, second.sprites.map(s => s.name), second.hasMore]
})
await call('listAllSprites', () => client.listAllSprites('door-'), ss => ss.map(s => s.name))
await call('bad token', async () => {
  try { return await new SpritesClient('mgk_bad', { baseURL: process.env.SPRITES_URL }).listSprites() } catch (e) { return apiErr(e) }
})

await call('exec', () => sprite.exec('echo hello world'), r => ({ stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }))
await call('execFile exit code', async () => {
  try { return await sprite.execFile('sh', ['-c', 'echo out; echo err >&2; exit 3']) } catch (e) { return failed(e) }
})
await call('execFile env cwd', () => sprite.execFile('sh', ['-c', 'echo "$SDK_VAR"; pwd'], { env: { SDK_VAR: 'from-env' }, cwd: '/tmp' }),
  r => ({ stdout: r.stdout, exitCode: r.exitCode }))
await call('spawn streaming', async () => {
  const cmd = sprite.spawn('sh', ['-c', 'for i in 1 2 3; do echo line$i; sleep 0.2; done; echo bad >&2; exit 5'])
  const chunks = []
  let stderr = ''
  cmd.stdout.on('data', c => chunks.push(c.toString()))
  cmd.stderr.on('data', c => { stderr += c.toString() })
  const code = await cmd.wait()
  return { chunks: chunks.length, stdout: chunks.join(''), stderr, code }
})
await call('spawn stdin', async () => {
  const cmd = sprite.spawn('cat', [])
  let out = ''
  cmd.stdout.on('data', c => { out += c.toString() })
  await new Promise((resolve, reject) => { cmd.once('spawn', resolve); cmd.once('error', reject) })
  cmd.stdin.write('piped through\n')
  cmd.stdin.end()
  const code = await cmd.wait()
  return { out, code }
})
await call('tty', async () => {
  const cmd = sprite.spawn('sh', ['-c', 'stty size; exit 4'], { tty: true, rows: 30, cols: 100 })
  let out = ''
  let exit
  cmd.stdout.on('data', c => { out += c.toString() })
  cmd.on('message', m => { if (m.type === 'exit') exit = m.exit_code })
  const code = await cmd.wait()
  const ok = sprite.spawn('true', [], { tty: true })
  ok.stdout.resume()
  return { out: out.trim(), code, exit, zero: await ok.wait() }
})

const marker = `door-session-${process.pid}`
const first = sprite.spawn('sh', ['-c', `echo first; sleep 1; echo second; exit 7 # ${marker}`], { maxRunAfterDisconnect: '30s' })
first.stdout.resume()
const found = await call('listSessions', async () => {
  for (let i = 0; i < 100; i++) {
    const ss = await sprite.listSessions()
    const s = ss.find(s => s.command.includes(marker))
    if (s) return s
    await sleep(50)
  }
  throw new Error('session never listed')
}, s => ({ id: typeof s.id, command: s.command.includes(marker), tty: s.tty }))
await call('attachSession', async () => {
  const att = sprite.attachSession(found.id)
  let out = ''
  att.stdout.on('data', c => { out += c.toString() })
  const code = await att.wait()
  return { out, code }
})
await call('spawner exit', () => first.wait())
await call('attach unknown', async () => {
  const att = sprite.attachSession('nosuch')
  return new Promise(resolve => { att.on('error', e => resolve(e.constructor.name)); att.once('exit', c => resolve('exit ' + c)) })
})
await call('killSession', async () => {
  const cmd = sprite.spawn('sleep', ['30'])
  cmd.stdout.resume()
  await new Promise((resolve, reject) => { cmd.once('spawn', resolve); cmd.once('error', reject) })
  let id
  for (let i = 0; i < 100 && !id; i++) {
    id = (await sprite.listSessions()).find(s => s.command === 'sleep 30')?.id
    if (!id) await sleep(50)
  }
  const stream = await sprite.killSession(id, 'SIGKILL')
  const events = []
  for await (const ev of stream) events.push(ev.type)
  return { events, code: await cmd.wait() }
})

await call('execFileHTTP', () => sprite.execFileHTTP('sh', ['-c', 'echo http-out; echo http-err >&2'], { env: { A: 'b' } }),
  r => ({ stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }))
await call('execFileHTTP stdin', () => sprite.execFileHTTP('cat', [], { input: 'from stdin' }), r => r.stdout)
await call('execFileHTTP exit code', async () => {
  try { return await sprite.execFileHTTP('sh', ['-c', 'echo partial; exit 9']) } catch (e) { return failed(e) }
})

await call('signal', async () => {
  const cmd = sprite.spawn('sh', ['-c', 'trap "echo got-term; exit 42" TERM; echo ready; while :; do sleep 0.1; done'])
  let out = ''
  const ready = new Promise(resolve => cmd.stdout.on('data', c => { out += c.toString(); if (out.includes('ready')) resolve() }))
  await ready
  cmd.kill('SIGTERM')
  return { code: await cmd.wait(), out }
})
await call('resize', async () => {
  const cmd = sprite.spawn('sh', ['-c', 'read x; stty size'], { tty: true, rows: 24, cols: 80 })
  let out = ''
  cmd.stdout.on('data', c => { out += c.toString() })
  await new Promise((resolve, reject) => { cmd.once('spawn', resolve); cmd.once('error', reject) })
  cmd.resize(120, 40)
  await sleep(300)
  cmd.stdin.write('go\r')
  await cmd.wait()
  return out.includes('40 120')
})
await call('createSession', async () => {
  const cmd = sprite.createSession('sh', ['-c', 'echo in-session; sleep 0.5; exit 0'])
  let out = ''
  cmd.stdout.on('data', c => { out += c.toString() })
  const code = await cmd.wait()
  const s = (await sprite.listSessions()).find(s => s.command.includes('in-session'))
  return { code, out: out.includes('in-session'), tty: s?.tty }
})

// A session whose creator's socket goes runs on for maxRunAfterDisconnect,
// then is terminated: listed, then no longer active.
await call('maxRunAfterDisconnect', async () => {
  const tag = `door-grace-${process.pid}`
  const cmd = sprite.spawn('sh', ['-c', `sleep 60 # ${tag}`], { maxRunAfterDisconnect: '1s' })
  cmd.stdout.resume()
  await new Promise((resolve, reject) => { cmd.once('spawn', resolve); cmd.once('error', reject) })
  let s
  for (let i = 0; i < 100 && !s; i++) {
    s = (await sprite.listSessions()).find(s => s.command.includes(tag))
    if (!s) await sleep(50)
  }
  const before = s?.isActive
  cmd.wsCmd.close() // the creator's socket goes; the command does not
  const gone = Date.now()
  await sleep(300)
  const stillRunning = (await sprite.listSessions()).find(x => x.id === s.id)?.isActive
  let activeAfterGone = true
  for (let i = 0; i < 100 && activeAfterGone; i++) {
    await sleep(100)
    activeAfterGone = (await sprite.listSessions()).find(x => x.id === s.id)?.isActive ?? false
  }
  return { before, stillRunning, ended: !activeAfterGone, tookAtLeastGrace: Date.now() - gone >= 900 }
})

await call('network policy', async () => {
  const rules = [{ domain: 'example.com', action: 'allow' }, { domain: '*', action: 'deny' }]
  await sprite.updateNetworkPolicy({ rules })
  const got = await sprite.getNetworkPolicy()
  let refused
  try { await sprite.updateNetworkPolicy({ rules: [{ domain: 'bad.example', action: 'deny' }] }) } catch (e) { refused = e.message }
  return { got: got.rules, refused: /^Invalid policy: .*invalid_policy/.test(refused) }
})

const fs = sprite.filesystem(process.env.FS_BASE)
await call('writeFile', () => fs.writeFile('notes/a.txt', 'hello sprite\n'))
await call('writeFile bytes', () => fs.writeFile('data/b.bin', Buffer.from([0, 1, 2, 255]), { mode: 0o600 }))
await call('readFile utf8', () => fs.readFile('notes/a.txt', 'utf8'))
await call('readFile bytes', () => fs.readFile('data/b.bin'))
await call('readFile missing', async () => {
  try { return await fs.readFile('notes/none.txt') } catch (e) { return { name: e.name, code: e.code, syscall: e.syscall } }
})
await call('mkdir', () => fs.mkdir('notes/sub/deep', { recursive: true }))
await call('readdir', () => fs.readdir('notes'), ns => ns.sort())
await call('readdir withFileTypes', () => fs.readdir('notes', { withFileTypes: true }),
  ds => ds.map(d => ({ name: d.name, dir: d.isDirectory(), file: d.isFile() })).sort((a, b) => a.name < b.name ? -1 : 1))
await call('readdir recursive', () => fs.readdir('notes', { recursive: true }), ns => ns.sort())
await call('stat', () => fs.stat('data/b.bin'), s => ({ size: s.size, mode: s.mode, dir: s.isDirectory(), file: s.isFile() }))
await call('exists', async () => [await fs.exists('notes/a.txt'), await fs.exists('notes/none.txt')])
await call('rename', async () => {
  await fs.rename('notes/a.txt', 'notes/renamed.txt')
  return [await fs.exists('notes/a.txt'), await fs.readFile('notes/renamed.txt', 'utf8')]
})
await call('copyFile', async () => {
  await fs.copyFile('notes/renamed.txt', 'notes/copy.txt')
  return fs.readFile('notes/copy.txt', 'utf8')
})
await call('chmod', async () => {
  await fs.chmod('notes/copy.txt', 0o640)
  return (await fs.stat('notes/copy.txt')).mode
})
await call('rm', async () => {
  await fs.rm('notes/copy.txt')
  return fs.exists('notes/copy.txt')
})
await call('rm non-empty dir', async () => {
  try { return await fs.rm('notes/sub') } catch (e) { return { name: e.name, code: e.code } }
})
await call('rm recursive', async () => {
  await fs.rm('notes/sub', { recursive: true })
  return fs.readdir('notes')
})

await call('writeJSON readJSON appendFile', async () => {
  await fs.writeJSON('j/x.json', { a: 1 })
  await fs.appendFile('j/log.txt', 'one\n')
  await fs.appendFile('j/log.txt', 'two\n')
  return { json: await fs.readJSON('j/x.json'), log: await fs.readFile('j/log.txt', 'utf8') }
})
await call('chown', async () => {
  const uid = Number((await sprite.execFile('id', ['-u'])).stdout.trim())
  await fs.chown('j/x.json', { uid, gid: uid })
  const owner = (await sprite.execFile('stat', ['-c', '%u:%g', `${process.env.FS_BASE}/j/x.json`])).stdout.trim()
  try { await fs.chown('j/none', { uid }) } catch (e) { return { same: owner === `${uid}:${uid}`, missing: e.code } }
})
// fs.watch is a WebSocket: the door's 501 reaches the SDK as a refused upgrade.
await call('fs watch', async () => { try { return await fs.watch('j') } catch (e) { return e.message.includes('non-101') } })

await call('createCheckpoint', async () => {
  await fs.writeFile('cp/kept.txt', 'before\n')
  const stream = await sprite.createCheckpoint('door')
  const events = []
  await stream.processAll(m => { events.push(m.type) })
  return events
})
await call('listCheckpoints', () => sprite.listCheckpoints(), l => l.map(c => typeof c.id))
await call('restoreCheckpoint', async () => {
  const id = (await sprite.listCheckpoints())[0].id
  await fs.writeFile('cp/kept.txt', 'after\n')
  await fs.writeFile('cp/later.txt', 'later\n')
  const got = await sprite.getCheckpoint(id)
  const stream = await sprite.restoreCheckpoint(id)
  const events = []
  await stream.processAll(m => { events.push(m.type) })
  return { got: got.id === id, events, kept: await fs.readFile('cp/kept.txt', 'utf8'), later: await fs.exists('cp/later.txt') }
})
await call('restore unknown', async () => {
  const stream = await sprite.restoreCheckpoint('nosuch')
  const events = []
  await stream.processAll(m => { events.push(m.type) })
  return events
})
await call('services', async () => { try { return await sprite.listServices() } catch (e) { return { error: e.message } } })

await call('updateSprite', async () => {
  await sprite.updateURLSettings({ auth: 'public' })
  const u = await sprite.update({ labels: ['team-a'] })
  const g = await client.getSprite('door-a')
  return { auth: g.urlSettings.auth, labels: g.labels, updated: u.labels }
})
await call('restart', async () => { try { return await sprite.restart() } catch (e) { return apiErr(e) } })
await call('check', async () => { try { return await sprite.check() } catch (e) { return apiErr(e) } })
await call('upgrade', async () => { try { return await sprite.upgrade() } catch (e) { return apiErr(e) } })
await call('privileges policy', async () => { try { return await sprite.getPrivilegesPolicy() } catch (e) { return e.message.includes('501') } })

await call('delete', () => sprite.delete())
await call('get deleted', async () => { try { return await client.getSprite('door-a') } catch (e) { return apiErr(e) } })
await call('delete other', () => client.deleteSprite('door-b'))
await call('list after delete', () => client.listSprites({ prefix: 'door-' }), r => r.sprites.map(s => s.name))
done()
process.exit(0)
