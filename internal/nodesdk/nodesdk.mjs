// nodesdk.mjs: the reporting helper internal/nodesdk writes beside every
// script it runs. Each call prints one line, "@@nodesdk " and JSON.
const PREFIX = '@@nodesdk '

function plain(v) {
  return JSON.stringify(v, function (key, val) {
    const raw = this[key]
    if (raw instanceof Uint8Array) return { $bytes: Buffer.from(raw).toString('base64') }
    if (raw instanceof ArrayBuffer) return { $bytes: Buffer.from(new Uint8Array(raw)).toString('base64') }
    if (raw instanceof Date) return raw.toISOString()
    if (typeof raw === 'bigint') return raw.toString()
    if (raw instanceof Map) return Object.fromEntries(raw)
    return val
  })
}

export function emit(obj) {
  process.stdout.write(PREFIX + plain(obj) + '\n')
}

// call runs fn, reports its result (mapped by map, when given) or what it
// threw, and returns the result (undefined when it threw).
export async function call(name, fn, map) {
  try {
    const v = await fn()
    let out = v
    if (map) out = await map(v)
    emit({ call: name, ok: true, value: out === undefined ? null : out })
    return v
  } catch (e) {
    const ename = (e && e.constructor && e.constructor.name) || typeof e
    const message = e && e.message !== undefined ? String(e.message) : String(e)
    emit({ call: name, ok: false, error: { name: ename, message } })
    return undefined
  }
}

// done reports that the script reached its end.
export function done() {
  process.stdout.write(PREFIX + '{"done":true}\n')
}
