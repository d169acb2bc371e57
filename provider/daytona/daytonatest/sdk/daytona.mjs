// daytona.mjs: a program for @daytonaio/sdk@0.218.0 written from the SDK's
// public API only. It reports each call through nodesdk's helper, so a Go
// test asserts every result. Endpoint and key come from the SDK's own
// variables, DAYTONA_API_URL and DAYTONA_API_KEY, so it runs unchanged
// against the daytonatest fake or a managoat front door. SDK_PREVIEW_PORT
// is a free loopback port for the preview-link check; SDK_PREFIX prefixes
// the sandboxes' names.
import { Daytona } from '@daytonaio/sdk'
import { call, done } from './nodesdk.mjs'

const prefix = process.env.SDK_PREFIX || 'sdk'
const port = Number(process.env.SDK_PREVIEW_PORT || '0')
const daytona = new Daytona()
const info = s => ({ id: s.id, name: s.name, state: s.state, labels: s.labels, toolbox: typeof s.toolboxProxyUrl === 'string' })
const text = b => Buffer.from(b).toString('utf8')
const sleep = ms => new Promise(r => setTimeout(r, ms))

const sbx = await call('create', () => daytona.create({ name: `${prefix}-a`, labels: { suite: prefix, role: 'a' }, envVars: { SDK_CREATED: 'yes' } }), info)
await call('create other', () => daytona.create({ name: `${prefix}-b`, labels: { suite: `${prefix}-other` } }), info)
await call('create duplicate', () => daytona.create({ name: `${prefix}-a` }))
await call('get', () => daytona.get(`${prefix}-a`), info)
await call('get by id', () => daytona.get(sbx.id), info)
await call('get missing', () => daytona.get(`${prefix}-missing`))
await call('list labels', async () => {
  const names = []
  for await (const s of daytona.list({ labels: { suite: prefix } })) names.push(s.name)
  return names.sort()
})

// process.executeCommand: exit code, output, cwd, env, timeout.
await call('exec exit', () => sbx.process.executeCommand('echo hi; echo oops >&2; exit 3'), r => ({ exitCode: r.exitCode, result: r.result }))
await call('exec cwd', async () => {
  await sbx.fs.createFolder('cwdtest', '755')
  return sbx.process.executeCommand('pwd', 'cwdtest')
}, r => ({ exitCode: r.exitCode, result: r.result }))
await call('exec env', () => sbx.process.executeCommand('echo "$SDK_VAR"', undefined, { SDK_VAR: 'from-env' }), r => ({ exitCode: r.exitCode, result: r.result }))
await call('exec timeout', () => sbx.process.executeCommand('sleep 20', undefined, undefined, 1))

// Sessions.
await call('createSession', () => sbx.process.createSession('s1'))
await call('getSession', () => sbx.process.getSession('s1'), s => ({ sessionId: s.sessionId, commands: s.commands.length }))
const syncCmd = await call('session sync', () => sbx.process.executeSessionCommand('s1', { command: 'echo out; echo err >&2; exit 4' }),
  r => ({ exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, output: r.output, cmdId: typeof r.cmdId }))
const asyncCmd = await call('session async', () => sbx.process.executeSessionCommand('s1', { command: 'for i in 1 2 3; do echo line$i; sleep 0.2; done; echo tail >&2', runAsync: true }),
  r => ({ cmdId: typeof r.cmdId, exitCode: r.exitCode ?? null }))
await call('session logs streaming', async () => {
  let stdout = '', stderr = ''
  await sbx.process.getSessionCommandLogs('s1', asyncCmd.cmdId, s => { stdout += s }, s => { stderr += s })
  return { stdout, stderr }
})
await call('session logs', () => sbx.process.getSessionCommandLogs('s1', asyncCmd.cmdId))
await call('session logs sync command', () => sbx.process.getSessionCommandLogs('s1', syncCmd.cmdId))
await call('getSessionCommand', () => sbx.process.getSessionCommand('s1', syncCmd.cmdId), c => ({ id: c.id === syncCmd.cmdId, command: c.command }))
await call('getSession after', () => sbx.process.getSession('s1'), s => ({ sessionId: s.sessionId, commands: s.commands.map(c => c.command) }))
await call('listSessions', () => sbx.process.listSessions(), ss => ss.map(s => s.sessionId))
await call('deleteSession', () => sbx.process.deleteSession('s1'))
await call('getSession deleted', () => sbx.process.getSession('s1'))

// File system.
await call('createFolder', () => sbx.fs.createFolder('work/sub', '750'))
await call('uploadFile', () => sbx.fs.uploadFile(Buffer.concat([Buffer.from('hello old world\n'), Buffer.from([0, 0xff])]), 'work/a.txt'))
await call('uploadFiles', () => sbx.fs.uploadFiles([
  { source: Buffer.from('second old\n'), destination: 'work/sub/b.txt' },
  { source: Buffer.from('not text'), destination: 'work/c.bin' },
]))
await call('downloadFile', () => sbx.fs.downloadFile('work/a.txt'))
await call('downloadFile missing', () => sbx.fs.downloadFile('work/none.txt'))
await call('downloadFiles', () => sbx.fs.downloadFiles([{ source: 'work/sub/b.txt' }, { source: 'work/none.txt' }]),
  rs => rs.map(r => ({ source: r.source, result: r.result ? text(r.result) : null, error: r.error ?? null })))
await call('listFiles', () => sbx.fs.listFiles('work'), fs => fs.map(f => ({ name: f.name, isDir: f.isDir, size: f.size })).sort((a, b) => a.name < b.name ? -1 : 1))
await call('getFileDetails', () => sbx.fs.getFileDetails('work/sub'), f => ({ name: f.name, isDir: f.isDir, permissions: f.permissions }))
await call('searchFiles', () => sbx.fs.searchFiles('work', '*.txt'), r => r.files.map(f => f.split('/').slice(-2).join('/')).sort())
await call('findFiles', () => sbx.fs.findFiles('work', 'old'), ms => ms.map(m => ({ file: m.file.split('/').slice(-2).join('/'), line: m.line, content: m.content })).sort((a, b) => a.file < b.file ? -1 : 1))
await call('replaceInFiles', async () => {
  const files = (await sbx.fs.searchFiles('work', '*.txt')).files
  return sbx.fs.replaceInFiles(files, 'old', 'new')
}, rs => rs.map(r => r.success))
await call('after replace', async () => text(await sbx.fs.downloadFile('work/sub/b.txt')))
await call('moveFiles', async () => {
  await sbx.fs.moveFiles('work/c.bin', 'work/sub/moved.bin')
  return text(await sbx.fs.downloadFile('work/sub/moved.bin'))
})
await call('setFilePermissions', async () => {
  await sbx.fs.setFilePermissions('work/a.txt', { mode: '600' })
  return (await sbx.fs.getFileDetails('work/a.txt')).permissions
})
await call('deleteFile', async () => {
  await sbx.fs.deleteFile('work/a.txt')
  return (await sbx.fs.listFiles('work')).map(f => f.name).sort()
})
await call('deleteFile dir without recursive', () => sbx.fs.deleteFile('work/sub'))
await call('deleteFile recursive', async () => {
  await sbx.fs.deleteFile('work/sub', true)
  return (await sbx.fs.listFiles('work')).map(f => f.name)
})

// A preview link for a port a process in the sandbox listens on.
if (port > 0) {
  await sbx.process.createSession('web')
  await sbx.process.executeSessionCommand('web', {
    command: `node -e "require('http').createServer((q,s)=>s.end('preview '+q.url)).listen(${port},'127.0.0.1')"`, runAsync: true,
  })
  const link = await call('getPreviewLink', () => sbx.getPreviewLink(port), l => ({ url: typeof l.url, token: typeof l.token, sandboxId: l.sandboxId === sbx.id }))
  await call('preview fetch', async () => {
    for (let i = 0; ; i++) {
      try {
        const r = await fetch(`${link.url}/hello`, { headers: { 'x-daytona-preview-token': link.token } })
        if (r.status === 502 && i < 100) { await sleep(100); continue }
        return { status: r.status, body: await r.text() }
      } catch (e) {
        if (i >= 100) throw e
        await sleep(100)
      }
    }
  })
  await call('preview without token', async () => (await fetch(`${link.url}/hello`)).status)
  await sbx.process.deleteSession('web')
}

// Input to a running session command, labels, directories, intervals.
await call('sendSessionCommandInput', async () => {
  await sbx.process.createSession('in')
  const c = await sbx.process.executeSessionCommand('in', { command: 'read line; echo "got:$line"', runAsync: true })
  await sbx.process.sendSessionCommandInput('in', c.cmdId, 'typed\n')
  let out = ''
  await sbx.process.getSessionCommandLogs('in', c.cmdId, s => { out += s }, () => {})
  await sbx.process.deleteSession('in')
  return out
})
await call('setLabels', () => sbx.setLabels({ suite: prefix, role: 'relabelled' }))
await call('list relabelled', async () => {
  const names = []
  for await (const s of daytona.list({ labels: { role: 'relabelled' } })) names.push(s.name)
  return names
})
await call('getUserHomeDir', () => sbx.getUserHomeDir())
await call('getWorkDir', () => sbx.getWorkDir())
await call('setAutostopInterval', async () => {
  await sbx.setAutostopInterval(30)
  await sbx.refreshData()
  return sbx.autoStopInterval
})

// Lifecycle.
await call('stop', async () => { await sbx.stop(); return sbx.state })
await call('get stopped', async () => (await daytona.get(`${prefix}-a`)).state)
await call('start', async () => { await sbx.start(); return sbx.state })
await call('exec after start', () => sbx.process.executeCommand('echo back'), r => r.result)
await call('delete', () => sbx.delete())
await call('get deleted', () => daytona.get(`${prefix}-a`))
await call('delete other', async () => (await daytona.get(`${prefix}-b`)).delete())
await call('list after delete', async () => {
  const names = []
  for await (const s of daytona.list({ labels: { suite: prefix } })) if (s.state !== 'destroyed' && s.state !== 'destroying') names.push(s.name)
  return names
})
done()
process.exit(0)
