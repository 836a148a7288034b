// AgentClient against a real `gpuslice agent` process serving a fake host tree.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

import { HostTree } from './hosttree.mjs'

const require = createRequire(import.meta.url)
const here = path.dirname(fileURLToPath(import.meta.url))
const { AgentClient, AgentError } = require('../agent.js')

function gpusliceBin() {
  if (process.env.GPUSLICE_BIN) return process.env.GPUSLICE_BIN
  const target = process.env.CARGO_TARGET_DIR || path.join(here, '..', '..', '..', 'target')
  const bin = path.join(target, 'debug', 'gpuslice')
  assert.ok(fs.existsSync(bin), `build the CLI first (cargo build -p gpuslice-cli): no ${bin}`)
  return bin
}

async function startAgent() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gpuslice-agent-'))
  const tree = new HostTree(path.join(dir, 'host'))
  tree.pci('0000:af:00.0', { vendor: 0x1002, device: 0x744c, cls: 0x030000, driver: 'amdgpu', group: 30 })
  const socket = path.join(dir, 'agent.sock')
  const child = spawn(gpusliceBin(), [
    '--root', tree.root, '--node', 'node-a', 'agent',
    '--listen', `unix:${socket}`, '--state-dir', path.join(dir, 'state'), '--resync', '0',
  ], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr.on('data', (c) => { stderr += c })
  const deadline = Date.now() + 30000
  while (!fs.existsSync(socket)) {
    assert.equal(child.exitCode, null, stderr)
    assert.ok(Date.now() < deadline, 'the agent did not start listening')
    await new Promise((r) => setTimeout(r, 50))
  }
  const stop = () => new Promise((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode)
    child.on('exit', (code) => resolve(code))
    child.kill('SIGTERM')
  })
  return { client: new AgentClient({ socket }), socket, stop, dir }
}

test('the client reads the topology and turns error documents into AgentErrors', async () => {
  const a = await startAgent()
  try {
    const t = await a.client.topology()
    assert.equal(t.node, 'node-a')
    assert.equal(typeof t.revision, 'number')
    assert.deepEqual(t.gpus.map((g) => g.address), ['0000:af:00.0'])
    const l = await a.client.vgpus()
    assert.deepEqual(l.mdevs, [])
    await assert.rejects(a.client.create({ parent: '../x', profile: 'p', machine: 'vm1' }), (e) => {
      assert.ok(e instanceof AgentError)
      assert.equal(e.kind, 'invalid-request')
      assert.equal(e.status, 400)
      return true
    })
    await assert.rejects(a.client.remove('neither'), (e) => e.kind === 'invalid-request')
    await assert.rejects(a.client.bind('nosuch'), (e) => e.status === 404 && e.kind === 'not-found')
    const elsewhere = { machine: 'vm-1', node: 'node-b', devices: [{ kind: 'gpu', request: 'gpu', name: 'gpu0', address: '0000:af:00.0' }] }
    await assert.rejects(a.client.realize(elsewhere), (e) => e.status === 400 && e.kind === 'invalid-request' && e.message.includes('node-b'))
  } finally {
    assert.equal(await a.stop(), 0)
    assert.ok(!fs.existsSync(a.socket), 'SIGTERM removes the socket')
    fs.rmSync(a.dir, { recursive: true, force: true })
  }
})

test('polling an unchanged agent is answered 304 from the kept document', async () => {
  const a = await startAgent()
  try {
    const first = await a.client.topology()
    const kept = a.client.cached.get('/v1/topology')
    assert.ok(kept && kept.etag.startsWith('"'), 'the answer carried an ETag')
    // A marker in place of the kept text shows the second read was a 304 served from the cache.
    a.client.cached.set('/v1/topology', { etag: kept.etag, text: '{"marker":true}' })
    assert.deepEqual(await a.client.topology(), { marker: true })
    // A tag the agent no longer serves gets the whole document again (sent gzip, decoded).
    a.client.cached.set('/v1/topology', { etag: '"0-0"', text: '{}' })
    assert.deepEqual(await a.client.topology(), first)
  } finally {
    await a.stop()
    fs.rmSync(a.dir, { recursive: true, force: true })
  }
})
