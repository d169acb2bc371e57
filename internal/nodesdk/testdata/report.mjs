import { call, done } from './nodesdk.mjs'
import { twice } from './sibling.mjs'

class NotFoundError extends Error {}

await call('env', () => ({ seen: process.env.NODESDK_TEST, leaked: process.env.NODESDK_LEAK ?? null }))
await call('sibling', () => twice(21))
await call('bytes', () => new Uint8Array([0, 1, 2, 255]))
await call('mapped', async () => ({ secret: 'x', id: 7 }), v => ({ id: v.id }))
await call('throws', async () => { throw new NotFoundError('no such thing') })
await call('undefined', () => undefined)
console.log('noise that is not a report {"call":"fake"}')
if (process.argv[2] === 'exit') process.exit(3)
done()
