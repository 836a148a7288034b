import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { inspect } from 'node:util'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

const { Fleet } = gpuslice

let topology
before(() => {
  const host = twoGpuHost()
  topology = gpuslice.discover({ root: host.root, node: 'node-a' })
  host.remove()
})

const vgpuMachine = (name = 'vm-vgpu', profile = 'T4-8Q') => ({
  name,
  devices: [{ name: 'gpu', profile }],
})
const wholeGpuMachine = { name: 'vm-whole', devices: [{ name: 'pass', vendor: 'amd' }] }
const fleetOf = (...names) =>
  Fleet.fromJSON({ nodes: names.map((node) => ({ ...topology, node })), allocations: [] })

test('a new fleet is empty', () => {
  const fleet = new Fleet()

  assert.deepEqual(fleet.allocations(), [])
  assert.deepEqual(fleet.toJSON(), { nodes: [], allocations: [] })
})

test('place puts a vGPU on a parent offering the profile', () => {
  const fleet = new Fleet()
  fleet.addNode(topology)

  const allocation = fleet.place(vgpuMachine())

  assert.equal(allocation.machine, 'vm-vgpu')
  assert.equal(allocation.node, 'node-a')
  assert.equal(allocation.status, 'pending')
  const [device] = allocation.devices
  assert.equal(device.kind, 'vgpu')
  assert.equal(device.profileName, 'GRID T4-8Q')
  assert.equal(device.parent, '0000:3b:00.0')
  assert.match(device.uuid, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
})

test('place hands out a whole GPU with the spread policy', () => {
  const fleet = fleetOf('node-a')

  const allocation = fleet.place(wholeGpuMachine, { policy: 'spread' })

  assert.deepEqual(allocation.devices, [
    { kind: 'gpu', request: 'pass', name: 'radeon0', address: '0000:af:00.0', functions: [] },
  ])
})

test('place with dryRun says where the Machine would go and records nothing', () => {
  const fleet = fleetOf('node-a', 'node-b')

  const whatIf = fleet.place(vgpuMachine(), { dryRun: true, policy: 'firstfit' })

  assert.equal(whatIf.node, 'node-a')
  assert.equal(whatIf.status, 'pending')
  assert.deepEqual(fleet.allocations(), [])
  const placed = fleet.place(vgpuMachine())
  assert.deepEqual(placed, whatIf)
})

test('place with targetNode goes there or throws UNSATISFIABLE with that node\'s reasons', () => {
  const fleet = fleetOf('node-a', 'node-b')

  assert.equal(fleet.place({ ...vgpuMachine(), targetNode: 'node-b' }).node, 'node-b')
  assert.throws(
    () =>
      fleet.place({
        name: 'vm-2',
        devices: [{ name: 'gpu', profile: 'T4-16Q', count: 2 }],
        targetNode: 'node-a',
      }),
    (e) => e.code === 'UNSATISFIABLE' && e.message.includes('0/1 nodes available'),
  )
})

test('place accepts Machines as YAML or JSON text', () => {
  const fleet = fleetOf('node-a')

  const fromYaml = fleet.place('name: vm-y\ndevices: [{name: gpu, profile: T4-8Q}]')
  const fromJson = fleet.place(JSON.stringify(vgpuMachine('vm-j')))

  assert.equal(fromYaml.devices[0].profileName, 'GRID T4-8Q')
  assert.equal(fromJson.devices[0].profileName, 'GRID T4-8Q')
})

test('place throws UNSATISFIABLE with structured reasons when no node holds the Machine', () => {
  const fleet = fleetOf('node-a')
  fleet.place(vgpuMachine('vm-1'))
  fleet.place(vgpuMachine('vm-2'))

  assert.throws(() => fleet.place(vgpuMachine('vm-3')), (err) => {
    assert.ok(err instanceof Error)
    assert.equal(err.code, 'UNSATISFIABLE')
    assert.match(err.message, /^0\/1 nodes available/)
    const [node] = err.reasons
    assert.equal(node.node, 'node-a')
    const [reason] = node.reasons
    assert.equal(reason.kind, 'TopologyUnsatisfiable')
    assert.equal(reason.request, 'gpu')
    assert.equal(reason.needed, 1)
    assert.equal(reason.free, 0)
    assert.equal(err.refusal.machine, 'vm-3')
    assert.equal(err.refusal.nodesTotal, 1)
    assert.deepEqual(err.refusal.nodes, err.reasons)
    return true
  })
})

test('place rejects a profile no node offers as INVALID_REQUEST', () => {
  const fleet = fleetOf('node-a')

  assert.throws(() => fleet.place(vgpuMachine('vm', 'A100-4C')), (err) => {
    assert.equal(err.code, 'INVALID_REQUEST')
    assert.match(err.message, /no node in the fleet offers vGPU profile "A100-4C"/)
    return true
  })
})

for (const [what, machine] of [
  ['no devices', { name: 'vm', devices: [] }],
  ['an unknown key', { name: 'vm', devices: [{ name: 'gpu', colour: 'red' }] }],
  ['profile with gpus', { name: 'vm', devices: [{ name: 'gpu', profile: 'T4-8Q', gpus: ['nvidia0'] }] }],
  ['a bad name', { name: '-bad', devices: [{ name: 'gpu' }] }],
  ['malformed YAML', 'name: vm\ndevices: [unclosed'],
  ['a number', 42],
]) {
  test(`place rejects a Machine with ${what} as INVALID_REQUEST`, () => {
    const fleet = fleetOf('node-a')
    assert.throws(() => fleet.place(machine), { code: 'INVALID_REQUEST' })
  })
}

test('place rejects an unknown policy; a Machine placed again gets its placement, a changed one is refused', () => {
  const fleet = fleetOf('node-a')

  assert.throws(() => fleet.place(vgpuMachine(), { policy: 'random' }), {
    code: 'INVALID_REQUEST',
    message: /random/,
  })
  const first = fleet.place(vgpuMachine())
  const again = fleet.place(vgpuMachine())
  assert.equal(again.alreadyPlaced, true)
  assert.deepEqual(again.devices, first.devices)
  assert.equal(fleet.allocations().length, 1)
  const changed = { ...vgpuMachine(), devices: [{ name: 'gpu', profile: 'T4-16Q' }] }
  assert.throws(() => fleet.place(changed), { code: 'INVALID_REQUEST' })
})

test('placeAsync resolves to the allocation off the JS thread', async () => {
  const fleet = fleetOf('node-a')

  const pending = fleet.placeAsync(vgpuMachine(), { policy: 'binpack' })

  assert.ok(pending instanceof Promise)
  const allocation = await pending
  assert.equal(allocation.devices[0].profileName, 'GRID T4-8Q')
  assert.deepEqual(fleet.allocations(), [allocation])
})

test('placeAsync rejects with the same errors place throws', async () => {
  const fleet = fleetOf('node-a')
  await fleet.placeAsync(vgpuMachine('vm-1'))
  await fleet.placeAsync(vgpuMachine('vm-2'))

  await assert.rejects(fleet.placeAsync(vgpuMachine('vm-3')), (err) => {
    assert.equal(err.code, 'UNSATISFIABLE')
    assert.equal(err.reasons[0].reasons[0].kind, 'TopologyUnsatisfiable')
    return true
  })
  await assert.rejects(fleet.placeAsync({ name: 'vm', devices: [] }), { code: 'INVALID_REQUEST' })
})

test('concurrent placeAsync calls never hand out one device twice', async () => {
  const fleet = fleetOf('node-0', 'node-1', 'node-2', 'node-3')

  const results = await Promise.allSettled(
    Array.from({ length: 20 }, (_, i) => fleet.placeAsync(vgpuMachine(`vm-${i}`, 'T4-4C'))),
  )

  const placed = results.filter((r) => r.status === 'fulfilled').map((r) => r.value)
  const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
  assert.equal(placed.length, 16, 'four T4s hold four 4 GB vGPUs each')
  assert.ok(refused.every((e) => e.code === 'UNSATISFIABLE'))
  assert.equal(new Set(placed.map((a) => a.devices[0].uuid)).size, 16)
})

test('release returns the allocation and frees its capacity', () => {
  const fleet = fleetOf('node-a')
  const first = fleet.place(vgpuMachine('vm-1'))
  fleet.place(vgpuMachine('vm-2'))

  assert.deepEqual(fleet.release('vm-1'), first)

  assert.deepEqual(fleet.allocations().map((a) => a.machine), ['vm-2'])
  assert.equal(fleet.place(vgpuMachine('vm-3')).node, 'node-a')
})

test('release and markCreated of an unknown Machine throw NOT_FOUND', () => {
  const fleet = fleetOf('node-a')

  assert.throws(() => fleet.release('ghost'), { code: 'NOT_FOUND', kind: 'machine', machine: 'ghost' })
  assert.throws(() => fleet.markCreated('ghost'), { code: 'NOT_FOUND', kind: 'machine' })
})

test('markCreated changes the status', () => {
  const fleet = fleetOf('node-a')
  fleet.place(vgpuMachine())

  fleet.markCreated('vm-vgpu')

  assert.equal(fleet.allocations()[0].status, 'created')
})

test('removeNode returns the topology; an unknown node throws NOT_FOUND', () => {
  const fleet = fleetOf('node-a')

  assert.equal(fleet.removeNode('node-a').node, 'node-a')

  assert.deepEqual(fleet.toJSON().nodes, [])
  assert.throws(() => fleet.removeNode('node-a'), { code: 'NOT_FOUND', kind: 'node', node: 'node-a' })
})

test('addNode accepts topology text and rejects malformed topologies with CONFIG_ERROR', () => {
  const fleet = new Fleet()

  fleet.addNode(JSON.stringify(topology))

  assert.deepEqual(fleet.toJSON().nodes, [topology])
  assert.throws(() => fleet.addNode({ node: 'n', gpus: [{ name: 'x' }] }), { code: 'CONFIG_ERROR' })
  assert.throws(() => fleet.addNode('node: ['), { code: 'CONFIG_ERROR' })
})

test('toJSON and fromJSON round-trip the fleet, allocations charged', () => {
  const fleet = fleetOf('node-a')
  fleet.place(vgpuMachine('vm-1'))
  fleet.markCreated('vm-1')

  const copy = Fleet.fromJSON(JSON.parse(JSON.stringify(fleet)))

  assert.deepEqual(copy.toJSON(), fleet.toJSON())
  assert.equal(copy.allocations()[0].status, 'created')
  copy.place(vgpuMachine('vm-2'))
  assert.throws(() => copy.place(vgpuMachine('vm-3')), { code: 'UNSATISFIABLE' })
  assert.deepEqual(Fleet.fromJSON(JSON.stringify(fleet)).toJSON(), fleet.toJSON())
})

test('fromJSON rejects duplicate nodes and malformed documents with CONFIG_ERROR', () => {
  assert.throws(() => Fleet.fromJSON({ nodes: [topology, topology], allocations: [] }), {
    code: 'CONFIG_ERROR',
    message: /node-a/,
  })
  assert.throws(() => Fleet.fromJSON({ nodes: 'many' }), { code: 'CONFIG_ERROR' })
})

test('planMigration plans a move without changing anything', () => {
  const fleet = fleetOf('node-a', 'node-b')
  const { node: source } = fleet.place(vgpuMachine())
  const target = source === 'node-a' ? 'node-b' : 'node-a'

  const plan = fleet.planMigration('vm-vgpu', target)

  assert.equal(plan.machine, 'vm-vgpu')
  assert.equal(plan.from, source)
  assert.equal(plan.to, target)
  assert.equal(plan.allocation.node, target)
  assert.deepEqual(plan.moves.map((m) => m.request), ['gpu'])
  assert.equal(fleet.allocations()[0].node, source)
})

test('planMigration onto named GPUs', () => {
  const fleet = fleetOf('node-a', 'node-b')
  const { node: source } = fleet.place(wholeGpuMachine)
  const target = source === 'node-a' ? 'node-b' : 'node-a'

  const plan = fleet.planMigration('vm-whole', target, ['radeon0'])

  assert.equal(plan.allocation.devices[0].name, 'radeon0')
})

test('planMigration names unknown Machines and nodes', () => {
  const fleet = fleetOf('node-a')
  fleet.place(vgpuMachine())

  assert.throws(() => fleet.planMigration('ghost', 'node-a'), { code: 'NOT_FOUND', kind: 'machine' })
  assert.throws(() => fleet.planMigration('vm-vgpu', 'node-z'), { code: 'NOT_FOUND', kind: 'node' })
  assert.throws(() => fleet.planMigration('vm-vgpu', 'node-a'), { code: 'INVALID_REQUEST' })
})

test('planDrain moves every Machine off a node', () => {
  const fleet = fleetOf('node-a', 'node-b')
  const { node } = fleet.place(vgpuMachine())

  const plan = fleet.planDrain(node)

  assert.equal(plan.node, node)
  assert.deepEqual(plan.moves.map((m) => m.machine), ['vm-vgpu'])
  assert.deepEqual(plan.stay, [])
  assert.throws(() => fleet.planDrain('node-z'), { code: 'NOT_FOUND', kind: 'node' })
})

test('planEvacuation lists Machines on unhealthy GPUs', () => {
  const fleet = fleetOf('node-a')
  fleet.place(wholeGpuMachine)
  assert.deepEqual(fleet.planEvacuation(), { machines: [] })

  const sick = structuredClone(topology)
  for (const gpu of sick.gpus) gpu.health = { state: 'Unhealthy', reasons: ['fatal AER error'] }
  fleet.addNode(sick)

  const [evacuation] = fleet.planEvacuation().machines
  assert.equal(evacuation.machine, 'vm-whole')
  assert.equal(evacuation.affected[0].health, 'Unhealthy')
})

// `unplace` (the CLI's `gpuslice unplace`), a profile no node offers, and what `util.inspect`
// shows of what the package returns: the content, not `Fleet {}` or `[Getter]`. The package's
// entry point (`main` in package.json) gives values their inspect.
const packageEntry = createRequire(import.meta.url)('../main.js')

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
  const { Fleet } = packageEntry
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

// Four GPUs behind NVSwitches: one partition of four, pairs (0, 2) and (1, 3), singles.
const hgxTopology = (node = 'hgx-1') => {
  const addrs = ['0000:18:00.0', '0000:2a:00.0', '0000:3a:00.0', '0000:5d:00.0']
  const gpus = addrs.map((address, i) => ({
    name: `nvidia${i}`,
    address,
    vendorId: '10de',
    deviceId: '2330',
    class: '0x030200',
    vendor: 'nvidia',
    state: 'free',
    memoryMiB: 81559,
  }))
  const part = (id, members) => ({
    id,
    gpus: members.map((i) => `nvidia${i}`),
    addresses: members.map((i) => addrs[i]),
    active: false,
  })
  const partitions = [part(1, [0, 1, 2, 3]), part(2, [0, 2]), part(3, [1, 3])]
  for (let i = 0; i < 4; i++) partitions.push(part(4 + i, [i]))
  return {
    node,
    gpus,
    mediatedDevices: { parents: [], pools: [] },
    fabric: { fabricManager: { state: 'reachable', mode: 'sharedNvswitch' }, partitions },
  }
}

test('a fleet carries NVSwitch partitions and places whole GPUs on one', () => {
  const fleet = new Fleet()
  fleet.addNode(hgxTopology())

  const pair = fleet.place({ name: 'vm', devices: [{ name: 'gpu', gpus: ['nvidia'], count: 2 }] })

  assert.deepEqual(pair.devices.map((d) => d.name).sort(), ['nvidia0', 'nvidia2'])
  const [node] = fleet.toJSON().nodes
  assert.deepEqual(node.fabric.fabricManager, { state: 'reachable', mode: 'sharedNvswitch' })
  assert.deepEqual(
    node.fabric.partitions.map((p) => p.id),
    [1, 2, 3, 4, 5, 6, 7],
  )
  // On a fresh node nvidia0 and nvidia1 are both free but no partition's members.
  const fresh = new Fleet()
  fresh.addNode(hgxTopology())
  assert.throws(
    () => fresh.place({ name: 'vm2', devices: [{ name: 'gpu', gpus: ['nvidia0', 'nvidia1'] }] }),
    (e) => e.code === 'UNSATISFIABLE' && e.reasons[0].reasons[0].kind === 'NoFreePartition',
  )
})
