// e2b.mjs: E2B's own SDK (e2b@2.51.0), through its public API only,
// against whatever server E2B_API_URL (control plane) and E2B_SANDBOX_URL
// (envd, routed by the E2b-Sandbox-Id header) name, with E2B_API_KEY.
// E2B_TEMPLATE picks the template (default "base"), E2B_USER_HOME the
// user's home (default /home/user). Each call's result is reported through
// nodesdk.mjs (internal/nodesdk) for a Go test to assert; nothing here
// knows which server it talks to. Every sandbox it makes is killed at the
// end, whatever failed.
import {
  Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, FileNotFoundError,
  AuthenticationError, TimeoutError,
} from 'e2b'
import { call, done } from './nodesdk.mjs'

const template = process.env.E2B_TEMPLATE || 'base'
const home = process.env.E2B_USER_HOME || '/home/user'
const suite = `nodesdk-${process.pid}-${Date.now()}`
const made = []

// until polls fn (every 50 ms, up to ms) until it returns a truthy value.
async function until(fn, ms = 10_000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > end) throw new Error('condition not met in time')
    await new Promise(r => setTimeout(r, 50))
  }
}

// thrown reports what fn threw (its class, and whether it is an instance
// of each class given), or that it did not throw.
async function thrown(fn, classes = {}) {
  try {
    const v = await fn()
    return { threw: false, value: v === undefined ? null : v }
  } catch (e) {
    const out = { threw: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e) }
    for (const [name, cls] of Object.entries(classes)) out[name] = e instanceof cls
    return out
  }
}

const who = s => ({ sandboxId: s.sandboxId })

try {
  // --- Lifecycle: create, list, info, timeout, connect ---
  const a = await call('create', () => Sandbox.create(template, {
    metadata: { suite, n: '1' }, envs: { SANDBOX_VAR: 'from-create' }, timeoutMs: 120_000,
  }), who)
  if (!a) throw new Error('create failed: nothing else can run')
  made.push(a)
  const b = await call('create second', () => Sandbox.create({ template, metadata: { suite, n: '2' }, timeoutMs: 120_000 }), who)
  if (b) made.push(b)
  const c = await call('create third', () => Sandbox.create(template, { metadata: { suite, n: '3' }, timeoutMs: 120_000 }), who)
  if (c) made.push(c)

  await call('list paged', async () => {
    const pager = Sandbox.list({ query: { metadata: { suite } }, limit: 2 })
    const pages = []
    while (pager.hasNext) {
      const items = await pager.nextItems()
      pages.push(items.map(x => ({ sandboxId: x.sandboxId, n: x.metadata.n, state: x.state, templateId: x.templateId })))
    }
    return pages
  })
  await call('list filtered', async () => {
    const items = await Sandbox.list({ query: { metadata: { suite, n: '2' } } }).nextItems()
    return items.map(x => x.sandboxId)
  })
  await call('list running', async () => {
    const items = await Sandbox.list({ query: { metadata: { suite }, state: ['running'] } }).nextItems()
    return items.length
  })

  await call('getInfo', () => a.getInfo(), i => ({
    sandboxId: i.sandboxId, templateId: i.templateId, metadata: i.metadata, state: i.state,
    ttlSeconds: Math.round((i.endAt - Date.now()) / 1000), envdVersion: i.envdVersion,
  }))
  await call('setTimeout', async () => {
    await a.setTimeout(600_000)
    const i = await a.getInfo()
    return { ttlSeconds: Math.round((i.endAt - Date.now()) / 1000) }
  })
  await call('isRunning', () => a.isRunning())
  await call('connect', async () => {
    const s = await Sandbox.connect(a.sandboxId)
    const r = await s.commands.run('echo connected')
    return { sandboxId: s.sandboxId, stdout: r.stdout }
  })

  // --- Commands ---
  await call('run', async () => {
    const out = [], err = []
    const r = await a.commands.run('echo out; echo err >&2; echo "$SANDBOX_VAR"', {
      onStdout: d => out.push(d), onStderr: d => err.push(d),
    })
    return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, streamedOut: out.join(''), streamedErr: err.join('') }
  })
  await call('run nonzero', () => thrown(() => a.commands.run('echo partial; echo bad >&2; exit 3'), { isCommandExitError: CommandExitError }))
  await call('run nonzero detail', async () => {
    try {
      await a.commands.run('echo partial; exit 3')
      return { threw: false }
    } catch (e) {
      if (!(e instanceof CommandExitError)) throw e
      return { exitCode: e.exitCode, stdout: e.stdout }
    }
  })
  await call('makeDir for cwd', () => a.files.makeDir(`${home}/work`))
  await call('cwd and envs', async () => {
    const r = await a.commands.run('echo "$FOO"; echo "$SANDBOX_VAR"; echo here > here.txt', { cwd: `${home}/work`, envs: { FOO: 'bar' } })
    return { stdout: r.stdout, inCwd: await a.files.read(`${home}/work/here.txt`) }
  })
  await call('background kill list', async () => {
    const h = await a.commands.run('sleep 30', { background: true })
    const before = (await a.commands.list()).map(p => p.pid)
    const killed = await h.kill()
    const waited = await thrown(() => h.wait(), { isCommandExitError: CommandExitError })
    const gone = await until(async () => !(await a.commands.list()).some(p => p.pid === h.pid))
    const again = await a.commands.kill(h.pid)
    return { listed: before.includes(h.pid), killed, waitThrew: waited.threw, waitIsExit: waited.isCommandExitError, gone, killAgain: again }
  })
  await call('sendStdin', async () => {
    const h = await a.commands.run('read line; echo "got:$line"', { background: true, stdin: true })
    await h.sendStdin('hello\n')
    const r = await h.wait()
    return r.stdout
  })
  await call('closeStdin', async () => {
    const h = await a.commands.run('cat', { background: true, stdin: true })
    await h.sendStdin('to cat')
    await h.closeStdin()
    return (await h.wait()).stdout
  })
  await call('commands.connect', async () => {
    const h = await a.commands.run('read go; echo "late:$go"', { background: true, stdin: true })
    const out = []
    const h2 = await a.commands.connect(h.pid, { onStdout: d => out.push(d) })
    await h.disconnect()
    await a.commands.sendStdin(h.pid, 'now\n')
    const r = await h2.wait()
    return { stdout: r.stdout, streamed: out.join('') }
  })
  await call('run timeout', () => thrown(() => a.commands.run('sleep 20', { timeoutMs: 1000 }), { isTimeoutError: TimeoutError }))

  // --- A terminal ---
  await call('pty', async () => {
    let text = ''
    const dec = new TextDecoder()
    const t = await a.pty.create({ cols: 80, rows: 24, onData: d => { text += dec.decode(d, { stream: true }) } })
    await a.pty.sendInput(t.pid, new TextEncoder().encode('stty size\n'))
    await until(() => text.includes('24 80'))
    await a.pty.resize(t.pid, { cols: 100, rows: 30 })
    await a.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit 0\n'))
    await until(() => text.includes('30 100'))
    const r = await t.wait()
    return { exitCode: r.exitCode, sawFirst: text.includes('24 80'), sawResized: text.includes('30 100') }
  })

  // --- Files ---
  const bytes = new Uint8Array(256).map((_, i) => i)
  await call('write text', () => a.files.write(`${home}/notes/hello.txt`, 'hello, world\n'), e => ({ name: e.name, path: e.path, type: e.type }))
  await call('read text', () => a.files.read(`${home}/notes/hello.txt`))
  await call('write bytes', () => a.files.write('notes/data.bin', bytes), e => ({ name: e.name, path: e.path }))
  await call('read bytes', () => a.files.read(`${home}/notes/data.bin`, { format: 'bytes' }))
  await call('write octet-stream', () => a.files.write(`${home}/octet/o.bin`, bytes, { useOctetStream: true }), e => ({ name: e.name, path: e.path }))
  await call('read octet-stream', async () => (await a.files.read(`${home}/octet/o.bin`, { format: 'bytes' })).length)
  await call('write gzip', () => a.files.write(`${home}/octet/z.txt`, 'zipped text', { gzip: true }), e => e.path)
  await call('read gzip', () => a.files.read(`${home}/octet/z.txt`))
  await call('write many', () => a.files.write([
    { path: `${home}/many/one.txt`, data: 'one' }, { path: `${home}/many/two.txt`, data: 'two' },
  ]), es => es.map(e => e.path).sort())
  await call('list', () => a.files.list(`${home}/notes`), es => es.map(e => ({ name: e.name, type: e.type, size: e.size, path: e.path })).sort((x, y) => x.name.localeCompare(y.name)))
  await call('list depth 2', () => a.files.list(home, { depth: 2 }), es => es.map(e => e.path).filter(p => p.includes('/notes')).sort())
  await call('makeDir', () => a.files.makeDir(`${home}/made/deep`))
  await call('makeDir again', () => a.files.makeDir(`${home}/made/deep`))
  await call('exists', async () => ({
    file: await a.files.exists(`${home}/notes/hello.txt`), dir: await a.files.exists(`${home}/made`),
    missing: await a.files.exists(`${home}/nope`),
  }))
  await call('getInfo file', () => a.files.getInfo(`${home}/notes/hello.txt`), e => ({ name: e.name, type: e.type, size: e.size, path: e.path, hasTime: e.modifiedTime instanceof Date }))
  await call('getInfo dir', () => a.files.getInfo(`${home}/made`), e => ({ name: e.name, type: e.type }))
  await call('rename', () => a.files.rename(`${home}/notes/hello.txt`, `${home}/moved/hello.txt`), e => ({ name: e.name, path: e.path }))
  await call('read renamed', () => a.files.read(`${home}/moved/hello.txt`))
  await call('read missing', () => thrown(() => a.files.read(`${home}/notes/hello.txt`), { isNotFound: NotFoundError, isFileNotFound: FileNotFoundError }))
  await call('remove', async () => {
    await a.files.remove(`${home}/made`)
    return a.files.exists(`${home}/made`)
  })
  await call('getInfo missing', () => thrown(() => a.files.getInfo(`${home}/made`), { isNotFound: NotFoundError }))
  await call('watchDir', async () => {
    await a.files.makeDir(`${home}/watched`)
    const events = []
    const w = await a.files.watchDir(`${home}/watched`, e => { events.push({ name: e.name, type: e.type }) })
    await a.files.write(`${home}/watched/new.txt`, 'x')
    await until(() => events.some(e => e.name === 'new.txt' && e.type === 'create'))
    await a.files.remove(`${home}/watched/new.txt`)
    await until(() => events.some(e => e.name === 'new.txt' && e.type === 'remove'))
    await w.stop()
    return { created: true, removed: true, names: [...new Set(events.map(e => e.name))] }
  })
  await call('watchDir recursive', async () => {
    await a.files.makeDir(`${home}/tree/sub`)
    const events = []
    const w = await a.files.watchDir(`${home}/tree`, e => { events.push(e) }, { recursive: true, includeEntry: true })
    await a.files.write(`${home}/tree/sub/leaf.txt`, 'leaf')
    const e = await until(() => events.find(e => e.name === 'sub/leaf.txt' && e.type === 'create'))
    await w.stop()
    return { name: e.name, entryPath: e.entry?.path, entryType: e.entry?.type }
  })
  await call('watchDir missing', () => thrown(() => a.files.watchDir(`${home}/no-such-dir`, () => {}), { isNotFound: NotFoundError }))

  await call('updateNetwork', () => a.updateNetwork({ allowOut: ['192.0.2.1'], denyOut: ['0.0.0.0/0'] }))

  // --- Pause and resume ---
  await call('pause', () => a.pause())
  await call('state paused', async () => (await a.getInfo()).state)
  await call('pause again', () => a.pause())
  await call('resume by connect', async () => {
    const s = await Sandbox.connect(a.sandboxId, { timeoutMs: 120_000 })
    const r = await s.commands.run('cat moved/hello.txt')
    return { state: (await s.getInfo()).state, stdout: r.stdout }
  })

  // --- Errors ---
  await call('connect unknown', () => thrown(() => Sandbox.connect('no-such-sandbox'), { isNotFound: NotFoundError, isSandboxNotFound: SandboxNotFoundError }))
  await call('getInfo unknown', () => thrown(() => Sandbox.getInfo('no-such-sandbox'), { isNotFound: NotFoundError }))
  await call('kill unknown', () => Sandbox.kill('no-such-sandbox'))
  await call('bad key', () => thrown(() => Sandbox.list({ apiKey: 'not-the-key' }).nextItems(), { isAuth: AuthenticationError }))
  await call('bad key create', () => thrown(() => Sandbox.create(template, { apiKey: 'not-the-key' }), { isAuth: AuthenticationError }))

  // --- Kill ---
  if (b) {
    await call('kill', () => b.kill())
    await call('kill again', () => b.kill())
    await call('list after kill', async () => (await Sandbox.list({ query: { metadata: { suite } } }).nextItems()).map(x => x.sandboxId).sort())
    await call('isRunning after kill', () => b.isRunning())
    await call('run after kill', () => thrown(() => b.commands.run('true'), { isNotFound: NotFoundError }))
  }
} finally {
  for (const s of made) await s.kill().catch(() => {})
}
done()
