// Refusals cost what they say; fleets share what is the same (issue 31).
import { test, before } from 'node:test'
import assert from 'node:assert/strict'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

const { Fleet } = gpuslice

let topology
before(() => {
  const host = twoGpuHost()
  topology = gpuslice.discover({ root: host.root, node: 'proto' })
  host.remove()
})

const names = Array.from({ length: 200 }, (_, i) => `n${String(i).padStart(3, '0')}`)
const tooMany = { name: 'vm', devices: [{ name: 'gpu', profile: 'T4-8Q', count: 99 }] }

const many = () => {
  const fleet = new Fleet()
  fleet.addNodes(topology, names)
  return fleet
}

test('a refusal carries the grouped summary and its documented fields', () => {
  assert.throws(() => many().place(tooMany), (err) => {
    assert.equal(err.code, 'UNSATISFIABLE')
    const [group] = err.groups
    assert.equal(group.nodeCount, 200)
    assert.deepEqual(group.firstNodes, names.slice(0, 5))
    assert.equal(group.reasons[0].kind, 'TopologyUnsatisfiable')
    assert.equal(group.reasons[0].needed, 99)
    assert.equal(err.refusal.machine, 'vm')
    assert.equal(err.refusal.nodesTotal, 200)
    assert.equal(err.refusal.nodesRefused, 200)
    assert.equal(err.refusal.message, err.message)
    assert.deepEqual(err.refusal.groups, err.groups)
    return true
  })
})

test('the per-node reasons are built when read and equal the refusal nodes', () => {
  assert.throws(() => many().place(tooMany), (err) => {
    const reasons = err.reasons
    assert.equal(reasons.length, 200)
    assert.equal(reasons[0].node, 'n000')
    assert.equal(reasons[199].node, 'n199')
    assert.deepEqual(err.refusal.nodes, reasons)
    assert.ok(Object.keys(err).includes('reasons'))
    return true
  })
})

test('a kept refusal still says what it said after the fleet changes', () => {
  const fleet = many()
  let kept
  assert.throws(() => fleet.place(tooMany), (err) => {
    kept = err
    return true
  })
  const groups = kept.groups
  for (let i = 0; i < 50; i++) {
    fleet.place({ name: `m${i}`, devices: [{ name: 'gpu', profile: 'T4-4C' }] })
  }
  fleet.release('m3')
  fleet.removeNode('n000')
  // The fleet changed: a new refusal says other things, on fewer nodes.
  assert.throws(() => fleet.place(tooMany), (err) => {
    assert.equal(err.refusal.nodesTotal, 199)
    assert.ok(err.groups.length >= 2)
    return true
  })
  // The kept one, read only now, is what the fleet said then.
  assert.deepEqual(kept.groups, groups)
  const reasons = kept.reasons
  assert.equal(reasons.length, 200)
  assert.deepEqual(
    reasons.map((n) => n.node),
    names,
  )
  for (const n of reasons) assert.deepEqual(n.reasons, groups[0].reasons)
})

test('many nodes of one shape are written once and read back', () => {
  const fleet = many()
  const text = fleet.toText()
  assert.match(text, /shapes:/)
  assert.equal(text.split('mediatedDevices').length - 1, 1)
  assert.deepEqual(Fleet.fromJSON(text).toJSON(), fleet.toJSON())
  assert.deepEqual(Fleet.fromJSON(fleet.toText(true)).toJSON(), fleet.toJSON())
})

test('the document cap is an option of fromJSON', () => {
  const fleet = many()
  const text = fleet.toText() + '#'.repeat(2 << 20)
  assert.throws(() => Fleet.fromJSON(text, { maxDocumentMib: 1 }), (err) => {
    assert.equal(err.code, 'CONFIG_ERROR')
    assert.match(err.message, /max-document-mib/)
    return true
  })
  assert.deepEqual(Fleet.fromJSON(text, { maxDocumentMib: 3 }).toJSON(), fleet.toJSON())
})

test('a compact fleet places as the full one', () => {
  const fleet = many()
  const compact = fleet.toText(true)
  const fleets = [
    Fleet.fromJSON(fleet.toJSON()),
    Fleet.fromJSON(compact),
    Fleet.fromJSON(JSON.parse(compact)),
    Fleet.fromJSON(fleet.toText()),
  ]
  const machines = ['T4-4C', 'T4-8Q', 'T4-4C', 'T4-8Q', 'T4-4C'].flatMap((p, i) =>
    Array.from({ length: 4 }, (_, j) => ({ name: `m${i}-${j}`, devices: [{ name: 'gpu', profile: p }] })),
  )
  const placed = fleets.map((f) => machines.map((m) => f.place(m)))
  for (const p of placed.slice(1)) assert.deepEqual(p, placed[0])
  assert.ok(new Set(placed[0].map((a) => a.node)).size > 1)
  for (const f of fleets) f.release('m1-0')
  const again = fleets.map((f) => f.place(machines[4]))
  for (const a of again.slice(1)) assert.deepEqual(a, again[0])
  for (const f of fleets.slice(1)) assert.deepEqual(f.toJSON(), fleets[0].toJSON())
  for (const f of fleets) assert.throws(() => f.place(tooMany), { code: 'UNSATISFIABLE' })
})
