import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

const LAYOUT = `version: v1
vgpu-configs:
  t4-8q:
    - devices: all
      vgpu-devices:
        "T4-8Q": 2
  t4-too-many:
    - devices: all
      vgpu-devices:
        "T4-8Q": 3
  a100:
    - devices: all
      vgpu-devices:
        "A100-4C": 1
`

let host
let topology
before(() => {
  host = twoGpuHost()
  topology = gpuslice.discover({ root: host.root, node: 'node-a' })
})
after(() => host.remove())

test('planVgpuConfig plans the instances to create', () => {
  const plan = gpuslice.planVgpuConfig(LAYOUT, 't4-8q', topology)

  assert.equal(plan.node, 'node-a')
  assert.equal(plan.config, 't4-8q')
  const [gpu] = plan.gpus
  assert.equal(gpu.gpu, '0000:3b:00.0')
  assert.deepEqual(gpu.types, [{ name: 'T4-8Q', typeId: 'nvidia-230', have: 0, want: 2 }])
  assert.equal(gpu.create.length, 2)
  assert.deepEqual(plan.steps.map((s) => s.op), ['create', 'create'])
})

test('planVgpuConfig keeps instances that already match', () => {
  host.mdevInstance('de306c9f-a714-4373-a290-dc15d4e49b71', '0000:3b:00.0', 'nvidia-230')
  const withOne = gpuslice.discover({ root: host.root, node: 'node-a' })

  const [gpu] = gpuslice.planVgpuConfig(LAYOUT, 't4-8q', withOne).gpus

  assert.deepEqual(gpu.keep.map((i) => i.uuid), ['de306c9f-a714-4373-a290-dc15d4e49b71'])
  assert.equal(gpu.create.length, 1)
})

test('planVgpuConfig accepts the topology as text', () => {
  assert.deepEqual(
    gpuslice.planVgpuConfig(LAYOUT, 't4-8q', JSON.stringify(topology)),
    gpuslice.planVgpuConfig(LAYOUT, 't4-8q', topology),
  )
})

for (const [what, text, name, message, kind] of [
  ['an unknown config', LAYOUT, 'nope', /nope/, 'unknown-config'],
  ['a type the GPU does not offer', LAYOUT, 'a100', /A100-4C/, 'unknown-type'],
  ['a layout that does not fit', LAYOUT, 't4-too-many', /T4-8Q/, 'does-not-fit'],
  ['malformed YAML', 'vgpu-configs: [', 'x', /./, 'decode'],
]) {
  test(`planVgpuConfig refuses ${what} with CONFIG_ERROR`, () => {
    assert.throws(() => gpuslice.planVgpuConfig(text, name, topology), { code: 'CONFIG_ERROR', message, kind })
  })
}

test('planVgpuConfig rejects a malformed topology with CONFIG_ERROR', () => {
  assert.throws(() => gpuslice.planVgpuConfig(LAYOUT, 't4-8q', { node: 3 }), { code: 'CONFIG_ERROR' })
})
