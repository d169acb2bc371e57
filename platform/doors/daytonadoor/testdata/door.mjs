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
// stdout and stderr are merged; their order across the two streams is not kept.
await call('exec exit', () => sbx.process.executeCommand('echo hi; echo oops >&2; exit 3'), r => ({ exitCode: r.exitCode, lines: r.result.split('\n').sort() }))
await call('exec created env', () => sbx.process.executeCommand('echo "$DOOR_CREATED"'), res)
await call('exec cwd', async () => {
  await sbx.process.executeCommand('mkdir -p cwdtest')
  return sbx.process.executeCommand('basename "$(pwd)"', 'cwdtest')
}, res)
await call('exec env', () => sbx.process.executeCommand('echo "$SDK_VAR"', undefined, { SDK_VAR: 'from-env' }), res)
await call('exec timeout', () => sbx.process.executeCommand('sleep 20', undefined, undefined, 1))
const text = b => Buffer.from(b).toString('utf8')
await call('createFolder', async () => {
  await sbx.fs.createFolder('work/sub', '750')
  return (await sbx.fs.getFileDetails('work/sub')).permissions
})
await call('uploadFile', async () => {
  await sbx.fs.uploadFile(Buffer.concat([Buffer.from('hello old world\n'), Buffer.from([0, 0xff])]), 'work/a.txt')
  return (await sbx.process.executeCommand('od -An -tx1 work/a.txt | tr -d " \\n"')).result
})
await call('uploadFiles', () => sbx.fs.uploadFiles([
  { source: Buffer.from('second old\n'), destination: 'work/sub/b.txt' },
  { source: Buffer.from('not text'), destination: 'work/c.bin' },
]))
await call('downloadFile', async () => [...await sbx.fs.downloadFile('work/a.txt')])
await call('downloadFile missing', () => sbx.fs.downloadFile('work/none.txt'))
await call('downloadFiles', () => sbx.fs.downloadFiles([{ source: 'work/sub/b.txt' }, { source: 'work/none.txt' }]),
  rs => rs.map(r => ({ source: r.source, result: r.result ? text(r.result) : null, error: r.error ? 'error' : null })))
await call('listFiles', () => sbx.fs.listFiles('work'), fs => fs.map(f => ({ name: f.name, isDir: f.isDir, size: f.isDir ? 0 : f.size })).sort((a, b) => a.name < b.name ? -1 : 1))
await call('listFiles missing', () => sbx.fs.listFiles('nowhere'))
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
await call('deleteFile', async () => {
  await sbx.fs.deleteFile('work/a.txt')
  return (await sbx.fs.listFiles('work')).map(f => f.name).sort()
})
await call('deleteFile dir without recursive', () => sbx.fs.deleteFile('work/sub'))
await call('deleteFile recursive', async () => {
  await sbx.fs.deleteFile('work/sub', true)
  return (await sbx.fs.listFiles('work')).map(f => f.name)
})
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
