// The fleet carries GPU-instance slots: a MIG-backed vGPU's allocation says where its GPU
// instance starts (`gpuInstanceStart`, chosen keep-most by the solver), and a fleet document
// read back holds the same starts and places the same.
import { test } from 'node:test'
import assert from 'node:assert/strict'

import gpuslice from './gpuslice.mjs'

const { Fleet } = gpuslice

const VFS = ['0000:10:00.4', '0000:10:00.5', '0000:10:00.6']
const health = { state: 'Healthy', reasons: [] }
const profile = (id, name, framebufferMiB, migSlices) => ({
  id,
  name: `NVIDIA ${name}`,
  framebufferMiB,
  availableInstances: 1,
  migSlices,
})

/** One H200 in MIG mode with three VFs, its pool tracking GPU-instance slots. */
const h200InMigMode = (node = 'h200-a') => ({
  node,
  gpus: [
    {
      name: 'nvidia0',
      address: '0000:10:00.0',
      vendorId: '10de',
      deviceId: '2335',
      class: '0x030200',
      vendor: 'nvidia',
      model: 'H200 SXM',
      state: 'in-use',
      memoryMiB: 144384,
      sriov: { totalVfs: 3, numVfs: 3, vfs: VFS },
      vgpuFramework: 'vendor-vfio',
      health,
    },
  ],
  mediatedDevices: {
    parents: VFS.map((id) => ({
      id,
      gpu: '0000:10:00.0',
      framework: 'vendor-vfio',
      health,
      profiles: [
        profile('1414', 'H200X-1-18C', 18432, 1),
        profile('1424', 'H200X-4-71C', 72704, 4),
      ],
      instances: [],
    })),
    pools: [
      {
        gpu: '0000:10:00.0',
        parents: VFS,
        totalMiB: 144384,
        usedMiB: 0,
        migSlicesTotal: 7,
        migSlicesUsed: 0,
        migSlots: { board: 'H200X' },
      },
    ],
  },
})

const vgpu = (name, profile) => ({ name, devices: [{ name: 'gpu', profile }] })

test('a MIG-backed vGPU is placed at the start that keeps a 4g possible', () => {
  const fleet = Fleet.fromJSON({ nodes: [h200InMigMode()], allocations: [] })

  const [one] = fleet.place(vgpu('vm-1', 'H200X-1-18C')).devices
  const [four] = fleet.place(vgpu('vm-4', 'H200X-4-71C')).devices

  assert.equal(one.gpuInstanceStart, 6)
  assert.equal(four.gpuInstanceStart, 0)
  assert.equal('placementId' in one, false)
})

test('a fleet document read back keeps the starts and places the same', () => {
  const fleet = Fleet.fromJSON({ nodes: [h200InMigMode()], allocations: [] })
  fleet.place(vgpu('vm-1', 'H200X-1-18C'))

  const doc = fleet.toJSON()
  assert.equal(doc.allocations[0].devices[0].gpuInstanceStart, 6)
  const back = Fleet.fromJSON(doc)

  assert.deepEqual(back.allocations(), fleet.allocations())
  const [four] = back.place(vgpu('vm-4', 'H200X-4-71C')).devices
  assert.equal(four.gpuInstanceStart, 0)
})
