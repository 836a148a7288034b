import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

const WHOLE_GPU_MACHINE = { name: 'vm-whole', devices: [{ name: 'pass', vendor: 'amd' }] }

let host
let topology
before(() => {
  host = twoGpuHost()
  topology = gpuslice.discover({ root: host.root, node: 'node-a' })
})
after(() => host.remove())

test('exportDra publishes DeviceClasses and the node\'s ResourceSlices', () => {
  const exported = gpuslice.exportDra([topology], { k8sVersion: '1.35', driver: 'gpu.example.com' })

  const kinds = new Set(exported.objects.map((o) => o.kind))
  assert.deepEqual([...kinds].sort(), ['DeviceClass', 'ResourceSlice'])
  const slices = exported.objects.filter((o) => o.kind === 'ResourceSlice')
  assert.ok(slices.every((s) => s.spec.nodeName === 'node-a' && s.spec.driver === 'gpu.example.com'))
  const names = slices.flatMap((s) => (s.spec.devices ?? []).map((d) => d.name))
  assert.ok(names.includes('gpu-0000-af-00-0'), names.join(' '))
})

test('exportDra refuses an unsupported Kubernetes version with INVALID_REQUEST', () => {
  assert.throws(() => gpuslice.exportDra([topology], { k8sVersion: '1.20' }), {
    code: 'INVALID_REQUEST',
    errorKind: 'invalid-argument',
    message: /unsupported Kubernetes version/,
  })
})

test('metricsText is the Prometheus exposition of the nodes', () => {
  const text = gpuslice.metricsText([topology], [])
  assert.match(text, /# TYPE gpuslice_gpu_vram_mib gauge/)
  assert.match(text, /node="node-a"/)
  assert.match(text.trimEnd(), /# EOF$/)
})

test('exportKubevirt permits the host\'s devices', () => {
  const patch = gpuslice.exportKubevirt([topology])
  assert.ok(patch.spec.configuration.permittedHostDevices)
})

test('qemuArgs hands an allocation\'s GPU to the VM, and refuses another node\'s', () => {
  const fleet = new gpuslice.Fleet()
  fleet.addNode(topology)
  const allocation = fleet.place(WHOLE_GPU_MACHINE)

  const args = gpuslice.qemuArgs(allocation, topology)
  assert.equal(args[0], '-device')
  assert.match(args[1], /host=0000:af:00\.0/)

  assert.throws(() => gpuslice.qemuArgs({ ...allocation, node: 'node-b' }, topology), {
    code: 'INVALID_REQUEST',
    message: /on node node-b, not node-a/,
  })
})
