// discoverAsync runs on the libuv thread pool: while it is blocked reading a file, the JS thread
// goes on. The file is a FIFO the JS thread feeds after the call returned its promise; a
// discoverAsync that worked on the JS thread would never return, which the child process's
// timeout turns into a failure.
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
fs.writeFileSync(fifo, '0x1002\\n') // returns once the worker opened the file
const topology = await pending
host.remove()
console.log(topology.gpus.map((g) => g.name).join(','))
`

test('discoverAsync reads the host off the JS thread', () => {
  const out = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 120_000,
  })

  assert.equal(out.status, 0, out.stderr)
  assert.equal(out.stdout.trim(), 'nvidia0,radeon0')
})
