import { test, beforeEach, afterEach } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

let host
beforeEach(() => {
  host = twoGpuHost()
})
afterEach(() => host.remove())

test('discover reads the GPUs, parents, profiles and pools of a host', () => {
  const topology = gpuslice.discover({ root: host.root, node: 'node-a' })

  assert.equal(topology.node, 'node-a')
  assert.deepEqual(topology.gpus.map((g) => g.name), ['nvidia0', 'radeon0'])
  const [t4, radeon] = topology.gpus
  assert.equal(t4.address, '0000:3b:00.0')
  assert.equal(t4.state, 'in-use')
  assert.equal(t4.vgpuFramework, 'mdev')
  assert.equal(t4.health.state, 'Healthy')
  assert.equal(radeon.state, 'free')
  const [parent] = topology.mediatedDevices.parents
  assert.ok(parent.profiles.some((p) => p.name === 'GRID T4-8Q'))
  assert.equal(topology.mediatedDevices.pools[0].totalMiB, 16384)
})

test('discover counts existing instances against the pool', () => {
  host.mdevInstance('de306c9f-a714-4373-a290-dc15d4e49b71', '0000:3b:00.0', 'nvidia-230')

  const topology = gpuslice.discover({ root: host.root, node: 'node-a' })

  const [parent] = topology.mediatedDevices.parents
  assert.deepEqual(parent.instances.map((i) => i.uuid), ['de306c9f-a714-4373-a290-dc15d4e49b71'])
  assert.equal(topology.mediatedDevices.pools[0].usedMiB, 8192)
})

test('discover names the node after this machine by default', () => {
  const topology = gpuslice.discover({ root: host.root })

  const expected = fs.readFileSync('/proc/sys/kernel/hostname', 'utf8').trim() || 'localhost'
  assert.equal(topology.node, expected)
})

test('discover of a missing root throws HOST_ERROR with path and errno', () => {
  const missing = path.join(os.tmpdir(), 'gpuslice-no-such-root')

  assert.throws(() => gpuslice.discover({ root: missing }), (err) => {
    assert.ok(err instanceof Error)
    assert.equal(err.code, 'HOST_ERROR')
    assert.equal(err.path, missing)
    assert.equal(err.errno, os.constants.errno.ENOENT)
    assert.match(err.message, /gpuslice-no-such-root/)
    return true
  })
})

test('discover of a root without sysfs throws HOST_ERROR naming what is missing', () => {
  const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'gpuslice-empty-'))
  try {
    assert.throws(() => gpuslice.discover({ root: empty }), {
      code: 'HOST_ERROR',
      path: empty,
      message: /sys\/bus\/pci\/devices/,
    })
  } finally {
    fs.rmSync(empty, { recursive: true })
  }
})

test('discover rejects an invalid node name with INVALID_REQUEST', async () => {
  assert.throws(() => gpuslice.discover({ root: host.root, node: 'bad name' }), {
    code: 'INVALID_REQUEST',
    message: /bad name/,
  })
  await assert.rejects(gpuslice.discoverAsync({ root: host.root, node: 'bad name' }), {
    code: 'INVALID_REQUEST',
  })
})

test('discoverAsync resolves to the same topology off the JS thread', async () => {
  const pending = gpuslice.discoverAsync({ root: host.root, node: 'node-a' })

  assert.ok(pending instanceof Promise)
  assert.deepEqual(await pending, gpuslice.discover({ root: host.root, node: 'node-a' }))
})

test('discoverAsync rejects with HOST_ERROR', async () => {
  await assert.rejects(gpuslice.discoverAsync({ root: '/nonexistent-gpuslice-root' }), {
    code: 'HOST_ERROR',
    path: '/nonexistent-gpuslice-root',
    errno: os.constants.errno.ENOENT,
  })
})

test('discover of this machine returns a topology or throws HOST_ERROR', () => {
  let topology
  try {
    topology = gpuslice.discover()
  } catch (err) {
    assert.equal(err.code, 'HOST_ERROR')
    assert.equal(fs.existsSync('/sys/bus/pci/devices'), false, err.message)
    return
  }
  assert.ok(Array.isArray(topology.gpus))
  assert.ok(topology.node.length > 0)
})
