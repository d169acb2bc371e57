// bench.mjs: commands.run('true') N times (BENCH_N) through E2B's SDK;
// reports the mean milliseconds of one run.
import { Sandbox } from 'e2b'
import { call, done } from './nodesdk.mjs'

const n = Number(process.env.BENCH_N || 20)
const s = await Sandbox.create('base')
try {
  await s.commands.run('true') // warm
  await call('run true', async () => {
    const t0 = performance.now()
    for (let i = 0; i < n; i++) await s.commands.run('true')
    return (performance.now() - t0) / n
  })
} finally {
  await s.kill().catch(() => {})
}
done()
