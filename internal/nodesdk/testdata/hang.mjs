import { spawn } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { call } from './nodesdk.mjs'
const child = spawn('sleep', ['600'], { stdio: 'ignore' })
writeFileSync(process.env.PIDFILE, String(child.pid))
await call('started', () => child.pid)
setInterval(() => {}, 1000)
