// bench.mjs: sprite.exec('true') and sprite.execFileHTTP('true') N times
// (BENCH_N) through the Sprites SDK; reports the mean milliseconds of one.
import { SpritesClient } from '@fly/sprites'
import { call, done } from './nodesdk.mjs'

const n = Number(process.env.BENCH_N || 20)
const client = new SpritesClient(process.env.SPRITES_TOKEN, { baseURL: process.env.SPRITES_URL })
const s = await client.createSprite('bench-sdk')
try {
  await s.exec('true') // warm
  await call('exec true', async () => {
    const t0 = performance.now()
    for (let i = 0; i < n; i++) await s.exec('true')
    return (performance.now() - t0) / n
  })
  await call('execFileHTTP true', async () => {
    const t0 = performance.now()
    for (let i = 0; i < n; i++) await s.execFileHTTP('true')
    return (performance.now() - t0) / n
  })
} finally {
  await s.delete().catch(() => {})
}
done()
