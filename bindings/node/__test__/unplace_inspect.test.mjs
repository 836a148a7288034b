// `unplace` (the CLI's `gpuslice unplace`), a profile no node offers, and what `util.inspect`
// shows of what the package returns: the content, not `Fleet {}` or `[Getter]`.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { inspect } from 'node:util'

import { createRequire } from 'node:module'

import { twoGpuHost } from './hosttree.mjs'

// The package's entry point (`main` in package.json), which gives values their inspect.
const gpuslice = createRequire(import.meta.url)('../main.js')

const { Fleet } = gpuslice

let topology
before(() => {
  const host = twoGpuHost()
  topology = gpuslice.discover({ root: host.root, node: 'node-a' })
  host.remove()
})

const vgpu = (name, profile = 'T4-8Q', count = 1) => ({
  name,
  devices: [{ name: 'gpu', profile, count }],
})

test('unplace releases the allocation and says whether it is on the host', () => {
  const fleet = new Fleet()
  fleet.addNode(topology)
  fleet.place(vgpu('vm-a'))
  fleet.markCreated('vm-a')
  const unplaced = fleet.unplace('vm-a')
  assert.equal(unplaced.machine, 'vm-a')
  assert.equal(unplaced.onHost, true)
  assert.deepEqual(fleet.allocations(), [])
  fleet.place(vgpu('vm-b'))
  assert.throws(() => fleet.unplace('vm-c'), (e) => {
    assert.equal(e.code, 'NOT_FOUND')
    assert.match(e.message, /nearest placed: vm-b/)
    return true
  })
})

test('a profile no node offers is an invalid request naming the nearest', () => {
  const fleet = new Fleet()
  fleet.addNode(topology)
  assert.throws(() => fleet.place(vgpu('vm-a', 'T4-88Q')), (e) => {
    assert.equal(e.code, 'INVALID_REQUEST')
    assert.match(e.message, /nearest offered: T4-8Q/)
    return true
  })
})

test('inspect shows a fleet and an error with their content', () => {
  const fleet = new Fleet()
  fleet.addNode(topology)
  fleet.place(vgpu('vm-a'))
  assert.equal(
    inspect(fleet),
    'Fleet { 1 node(s): node-a; 1 allocation(s): vm-a on node-a (pending) }',
  )
  let err
  try {
    fleet.place(vgpu('vm-big', 'T4-8Q', 64))
  } catch (e) {
    err = e
  }
  assert.equal(err.code, 'UNSATISFIABLE')
  const text = inspect(err)
  assert.doesNotMatch(text, /\[Getter\]/)
  assert.match(text, /code: 'UNSATISFIABLE'/)
  assert.match(text, /node: 'node-a'/)
  assert.match(text, /reasons: \[/)
})
