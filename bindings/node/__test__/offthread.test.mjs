// discoverAsync runs on the libuv thread pool: while it reads the host, the JS thread goes on. A
// FIFO stands in place of a sysfs file: gpuslice refuses to read it (it would wait for a writer),
// and the JS thread keeps trying to feed it without blocking until the promise settles. A
// discoverAsync that worked on the JS thread, or a read that blocked on the FIFO, would never
// return, which the child process's timeout turns into a failure.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))

const script = `
import fs from 'node:fs'
import { execFileSync } from 'node:child_process'
import gpuslice from ${JSON.stringify(path.join(here, 'gpuslice.mjs'))}
import { twoGpuHost } from ${JSON.stringify(path.join(here, 'hosttree.mjs'))}

const host = twoGpuHost()
const fifo = host.root + '/sys/devices/pci0000:00/0000:af:00.0/vendor'
fs.rmSync(fifo)
execFileSync('mkfifo', [fifo])
const pending = gpuslice.discoverAsync({ root: host.root, node: 'n' })
let done = false
pending.finally(() => { done = true })
let spins = 0
while (!done) {
  spins++
  try {
    const fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK)
    try { fs.writeSync(fd, '0x1002\\n') } catch {} finally { fs.closeSync(fd) }
  } catch {} // ENXIO: no reader has it open
  await new Promise((resolve) => setImmediate(resolve))
}
const topology = await pending
host.remove()
console.log(spins > 0, topology.gpus.map((g) => g.name).join(','))
`

test('discoverAsync reads the host off the JS thread', () => {
  const out = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 120_000,
  })

  assert.equal(out.status, 0, out.stderr)
  const [ran, names] = out.stdout.trim().split(' ')
  assert.equal(ran, 'true')
  assert.ok(names.split(',').includes('nvidia0'), out.stdout)
})
