// door.mjs: E2B's SDK (e2b@2.51.0, public API only) against managoat's E2B
// front door: the subset the door serves (see the package doc). Each
// call's result is reported for door_test.go to assert.
import { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, AuthenticationError } from 'e2b'
import { call, done } from './nodesdk.mjs'

const home = process.env.E2B_USER_HOME || '/home/user'
const suite = `door-${process.pid}-${Date.now()}`
const made = []
const who = s => ({ sandboxId: s.sandboxId })
async function thrown(fn, classes = {}) {
  try { const v = await fn(); return { threw: false, value: v === undefined ? null : v } } catch (e) {
    const out = { threw: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e) }
    for (const [n, c] of Object.entries(classes)) out[n] = e instanceof c
    return out
  }
}
try {
  const a = await call('create', () => Sandbox.create('base', { metadata: { suite, n: '1' }, envs: { SANDBOX_VAR: 'from-create' }, timeoutMs: 120_000 }), who)
  if (!a) throw new Error('create failed')
  made.push(a)
  const b = await call('create second', () => Sandbox.create({ metadata: { suite, n: '2' } }), who)
  if (b) made.push(b)
  await call('list paged', async () => {
    const pager = Sandbox.list({ query: { metadata: { suite } }, limit: 1 })
    const pages = []
    while (pager.hasNext) pages.push((await pager.nextItems()).map(x => x.metadata.n))
    return pages
  })
  await call('list filtered', async () => (await Sandbox.list({ query: { metadata: { suite, n: '2' } } }).nextItems()).map(x => x.sandboxId))
  await call('getInfo', () => a.getInfo(), i => ({ sandboxId: i.sandboxId, templateId: i.templateId, n: i.metadata.n, state: i.state, ttl: Math.round((i.endAt - Date.now()) / 1000) }))
  await call('setTimeout', async () => { await a.setTimeout(600_000); const i = await a.getInfo(); return Math.round((i.endAt - Date.now()) / 1000) })
  await call('isRunning', () => a.isRunning())
  await call('connect', async () => { const s = await Sandbox.connect(a.sandboxId); return (await s.commands.run('echo connected')).stdout })
  await call('run', async () => {
    const out = [], err = []
    const r = await a.commands.run('echo out; echo err >&2; echo "$SANDBOX_VAR"', { onStdout: d => out.push(d), onStderr: d => err.push(d) })
    return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, streamedOut: out.join(''), streamedErr: err.join('') }
  })
  await call('run nonzero', async () => {
    try { await a.commands.run('echo partial; exit 3'); return { threw: false } } catch (e) {
      return { isExit: e instanceof CommandExitError, exitCode: e.exitCode, stdout: e.stdout }
    }
  })
  await call('cwd and envs', async () => (await a.commands.run('echo "$FOO"; pwd', { cwd: '/tmp', envs: { FOO: 'bar' } })).stdout)
  await call('sendStdin', async () => {
    const h = await a.commands.run('read line; echo "got:$line"', { background: true, stdin: true })
    try { await h.sendStdin('hello\n') } catch (e) {
      const w = await h.wait().catch(x => x) // what the command saw, for the failure's message
      throw new Error(`${e.message}; the command printed ${JSON.stringify(w.stdout)} ${JSON.stringify(w.stderr)} exit ${w.exitCode}`)
    }
    return (await h.wait()).stdout
  })
  await call('closeStdin', async () => {
    const h = await a.commands.run('cat', { background: true, stdin: true })
    await h.sendStdin('to cat'); await h.closeStdin()
    return (await h.wait()).stdout
  })
  await call('background kill list', async () => {
    const h = await a.commands.run('sleep 30', { background: true })
    const listed = (await a.commands.list()).some(p => p.pid === h.pid)
    const killed = await h.kill()
    const w = await thrown(() => h.wait(), { isExit: CommandExitError })
    return { listed, killed, waitIsExit: w.isExit }
  })
  await call('pty', async () => {
    let text = ''
    const dec = new TextDecoder()
    const until = async f => { const end = Date.now() + 10_000; while (!f()) { if (Date.now() > end) throw new Error('not in time: ' + JSON.stringify(text)); await new Promise(r => setTimeout(r, 50)) } }
    const t = await a.pty.create({ cols: 80, rows: 24, onData: d => { text += dec.decode(d, { stream: true }) } })
    await a.pty.sendInput(t.pid, new TextEncoder().encode('stty size\n'))
    await until(() => text.includes('24 80'))
    await a.pty.resize(t.pid, { cols: 100, rows: 30 })
    await a.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit 0\n'))
    await until(() => text.includes('30 100'))
    return (await t.wait()).exitCode
  })
  await call('write text', () => a.files.write(`${home}/door-hello.txt`, 'hello, world\n'), e => ({ name: e.name, path: e.path }))
  await call('read text', () => a.files.read(`${home}/door-hello.txt`))
  const bytes = new Uint8Array(256).map((_, i) => i)
  await call('write bytes', () => a.files.write(`${home}/door-data.bin`, bytes, { useOctetStream: true }), e => e.path)
  await call('read bytes', async () => { const r = await a.files.read(`${home}/door-data.bin`, { format: 'bytes' }); return r.length === 256 && r.every((v, i) => v === i) })
  await call('write many', () => a.files.write([
    { path: `${home}/many/one.txt`, data: 'one' }, { path: `${home}/many/two.txt`, data: 'two' },
  ]), es => es.map(e => e.path).sort())
  await call('read many', async () => [await a.files.read(`${home}/many/one.txt`), await a.files.read(`${home}/many/two.txt`)])
  await call('read missing', () => thrown(() => a.files.read(`${home}/door-no-such-file`), { isNotFound: NotFoundError }))
  await call('list', () => a.files.list(`${home}/many`), es => es.map(e => ({ name: e.name, type: e.type, size: e.size, path: e.path })).sort((x, y) => x.name.localeCompare(y.name)))
  await call('list depth 2', () => a.files.list(home, { depth: 2 }), es => es.map(e => e.path).filter(p => p.includes('/many')).sort())
  await call('makeDir', () => a.files.makeDir(`${home}/made/deep`))
  await call('makeDir again', () => a.files.makeDir(`${home}/made/deep`))
  await call('exists', async () => ({ file: await a.files.exists(`${home}/door-hello.txt`), dir: await a.files.exists(`${home}/made`), missing: await a.files.exists(`${home}/nope`) }))
  await call('getInfo file', () => a.files.getInfo(`${home}/door-hello.txt`), e => ({ name: e.name, type: e.type, size: e.size, path: e.path, hasTime: e.modifiedTime instanceof Date }))
  await call('getInfo dir', () => a.files.getInfo(`${home}/made`), e => ({ name: e.name, type: e.type }))
  await call('rename', () => a.files.rename(`${home}/door-hello.txt`, `${home}/moved/hello.txt`), e => ({ name: e.name, path: e.path }))
  await call('read renamed', () => a.files.read(`${home}/moved/hello.txt`))
  await call('remove', async () => { await a.files.remove(`${home}/made`); return a.files.exists(`${home}/made`) })
  await call('watchDir', async () => {
    const dir = `${home}/watched`
    await a.files.makeDir(dir)
    await a.commands.run(`echo old > ${dir}/old.txt`)
    const seen = []
    const w = await a.files.watchDir(dir, e => { seen.push(`${e.type} ${e.name}`) })
    const saw = async want => { const end = Date.now() + 20_000; while (!seen.includes(want)) { if (Date.now() > end) throw new Error(`no "${want}" event; saw ${JSON.stringify(seen)}`); await new Promise(r => setTimeout(r, 50)) } return want }
    const got = []
    await a.files.write(`${dir}/new.txt`, 'new')
    got.push(await saw('create new.txt'))
    await a.commands.run(`echo more >> ${dir}/old.txt`)
    got.push(await saw('write old.txt'))
    await a.commands.run(`chmod 600 ${dir}/old.txt`)
    got.push(await saw('chmod old.txt'))
    await a.commands.run(`mv ${dir}/new.txt ${dir}/renamed.txt`)
    got.push(await saw('rename new.txt'), await saw('create renamed.txt'))
    await a.commands.run(`rm ${dir}/old.txt`)
    got.push(await saw('remove old.txt'))
    // a name holding the record's separators and a newline is one event
    await a.commands.run('touch "$DIR/$NAME"', { envs: { DIR: dir, NAME: 'a|b\nc' } })
    got.push(await saw('create a|b\nc'))
    await w.stop()
    const missing = await thrown(() => a.files.watchDir(`${home}/no-such-dir`, () => {}), { isNotFound: NotFoundError })
    // a directory past the door's bound ends the watch, never a partial snapshot
    await a.commands.run(`mkdir ${home}/crowded && cd ${home}/crowded && seq 10001 | xargs touch`)
    const crowded = await thrown(() => a.files.watchDir(`${home}/crowded`, () => {}))
    await a.commands.run(`rm -rf ${home}/crowded ${dir}`)
    return { got, missing: missing.isNotFound, crowded: crowded.threw !== false && /10000 entries/.test(crowded.message) }
  })
  await call('getInfo missing', () => thrown(() => a.files.getInfo(`${home}/made`), { isNotFound: NotFoundError }))
  await call('connect unknown', () => thrown(() => Sandbox.connect('no-such-sandbox'), { isNotFound: NotFoundError, isSandboxNotFound: SandboxNotFoundError }))
  await call('kill unknown', () => Sandbox.kill('no-such-sandbox'))
  await call('bad key', () => thrown(() => Sandbox.list({ apiKey: 'mgk_not-the-key' }).nextItems(), { isAuth: AuthenticationError }))
  const until = async (f, ms = 60_000) => { const end = Date.now() + ms; for (;;) { const v = await f(); if (v) return v; if (Date.now() > end) throw new Error('not in time'); await new Promise(r => setTimeout(r, 100)) } }
  await call('timeout expiry', async () => {
    const s = await Sandbox.create({ metadata: { suite, n: 'expiry' }, timeoutMs: 2_000 })
    made.push(s)
    const runningBefore = await s.isRunning()
    const gone = await until(async () => (await Sandbox.list({ query: { metadata: { suite, n: 'expiry' } } }).nextItems()).length === 0)
    return { sandboxId: s.sandboxId, runningBefore, runningAfter: await s.isRunning().catch(() => false), gone }
  })
  await call('setTimeout expiry', async () => {
    const t0 = Date.now()
    const s = await Sandbox.create({ metadata: { suite, n: 'extended' }, timeoutMs: 5_000 })
    made.push(s)
    await s.setTimeout(120_000)
    // past create's end, far inside setTimeout's
    await new Promise(r => setTimeout(r, Math.max(0, t0 + 6_000 - Date.now())))
    const listed = async () => (await Sandbox.list({ query: { metadata: { suite, n: 'extended' } } }).nextItems()).length === 1
    const runningAtFirstEnd = await listed()
    await s.setTimeout(1_000)
    await until(async () => !(await listed()))
    return { runningAtFirstEnd, runningAfter: await s.isRunning().catch(() => false) }
  })
  if (b) {
    await call('kill', () => b.kill())
    await call('kill again', () => b.kill())
    await call('list after kill', async () => (await Sandbox.list({ query: { metadata: { suite } } }).nextItems()).map(x => x.sandboxId))
  }
} finally {
  for (const s of made) await s.kill().catch(() => {})
}
done()
