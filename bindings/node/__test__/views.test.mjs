// What the CLI's fleet views show, from Node: `Fleet#nodeView` (as `gpuslice topology
// --inventory FLEET --node NAME`: pending vGPUs charged against the free counts, each instance
// named with its Machine) and `discover({holders: true})` (the HOLDER column).
import { test } from 'node:test'
import assert from 'node:assert/strict'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

const T4 = '0000:3b:00.0'

const usedMiB = (view, gpu) => view.mediatedDevices.pools.find((p) => p.gpu === gpu).usedMiB

test('nodeView charges a pending vGPU and names its Machine', () => {
  const host = twoGpuHost()
  const fleet = new gpuslice.Fleet()
  fleet.addNode(gpuslice.discover({ root: host.root, node: 'node-a' }))
  host.remove()
  const before = fleet.nodeView('node-a')
  assert.deepEqual(before.allocatedInstances, [])
  fleet.place({ name: 'vm-a', devices: [{ name: 'gpu', profile: 'T4-8Q' }] })
  const view = fleet.nodeView('node-a')
  const snapshot = fleet.toJSON().nodes[0]
  assert.equal(usedMiB(before, T4), 0)
  assert.equal(usedMiB(snapshot, T4), 0)
  assert.equal(usedMiB(view, T4), 8192)
  assert.equal(view.allocatedInstances.length, 1)
  const [i] = view.allocatedInstances
  assert.deepEqual([i.machine, i.status, i.made, i.parent], ['vm-a', 'pending', false, T4])
  // A free GPU allocated whole is shown in use, naming its Machine (the snapshot: free).
  fleet.place({ name: 'vm-whole', devices: [{ name: 'pass', vendor: 'amd' }] })
  const amd = fleet.nodeView('node-a').gpus.find((g) => g.vendor === 'amd')
  assert.equal(amd.state, 'in-use')
  assert.match(amd.stateReason, /vm-whole/)
  assert.equal(fleet.toJSON().nodes[0].gpus.find((g) => g.vendor === 'amd').state, 'free')
  assert.throws(() => fleet.nodeView('node-b'), (e) => e.code === 'NOT_FOUND')
})

test('discover with holders names the process holding a GPU open', () => {
  const host = twoGpuHost()
  try {
    host.pci('0000:d8:00.0', { vendor: 0x10de, device: 0x2236, cls: 0x030200, driver: 'vfio-pci', group: 40 })
    host.link('proc/4242/fd/7', '/dev/vfio/40')
    host.file('proc/4242/comm', 'qemu-system-x86\n')
    const held = gpuslice.discover({ root: host.root, node: 'node-a', holders: true })
    const gpu = held.gpus.find((g) => g.address === '0000:d8:00.0')
    assert.equal(gpu.holder.pid, 4242)
    assert.equal(gpu.holder.command.trim(), 'qemu-system-x86')
    assert.equal(gpu.holder.node, '/dev/vfio/40')
    const plain = gpuslice.discover({ root: host.root, node: 'node-a' })
    assert.ok(plain.gpus.every((g) => !('holder' in g)))
  } finally {
    host.remove()
  }
})
