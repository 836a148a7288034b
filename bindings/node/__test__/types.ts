// Compiled by `tsc` (npm test): the generated `index.d.ts` must describe the documents precisely
// enough that this typed client code checks, and the `@ts-expect-error` lines must stay errors.
import {
  Allocation,
  Fleet,
  GpuHealthReport,
  HostError,
  Machine,
  NodeTopology,
  NodeView,
  Placement,
  UnsatisfiableError,
  VgpuPlan,
  discover,
  discoverAsync,
  health,
  planVgpuConfig,
} from '../index'

const topology: NodeTopology = discover({ root: '/', node: 'n1' })
const freeGpus: string[] = topology.gpus.filter((g) => g.state === 'free').map((g) => g.name)
const offered: number = topology.mediatedDevices.parents[0].profiles[0].availableInstances

const machine: Machine = {
  name: 'vm',
  devices: [{ name: 'gpu', profile: 'A2-4Q' }, { name: 'pass', vendor: 'amd', minMemory: '16Gi' }],
}
const fleet = new Fleet()
fleet.addNode(topology)
const placed: Placement = fleet.place(machine, { policy: 'spread' })
for (const d of placed.devices) {
  if (d.kind === 'vgpu') {
    const uuid: string = d.uuid
    void uuid
  } else {
    const address: string = d.address
    void address
  }
}
const allocations: Allocation[] = fleet.allocations()
const view: NodeView = fleet.nodeView('n1')
const machines: string[] = view.allocatedInstances.map((i) => i.machine)
const pending: boolean = view.allocatedInstances.some((i) => !i.made)
const held: NodeTopology = discover({ root: '/', holders: true })
const pids: number[] = held.gpus.flatMap((g) => (g.holder ? [g.holder.pid] : []))
void machines
void pending
void pids
const async: Promise<Placement> = fleet.placeAsync('name: vm2\ndevices: [{name: g}]')
const later: Promise<NodeTopology> = discoverAsync()
const reports: GpuHealthReport[] = health({ policy: { link: { judgeWidth: false } } })
const plan: VgpuPlan = planVgpuConfig('version: v1', 'cfg', topology)
const copy: Fleet = Fleet.fromJSON(fleet.toJSON())

function explain(err: unknown): string {
  const e = err as UnsatisfiableError | HostError
  if (e.code === 'UNSATISFIABLE') {
    return e.reasons.map((n) => `${n.node}: ${n.reasons.map((r) => r.kind).join(', ')}`).join('; ')
  }
  return `${e.path ?? ''} errno ${e.errno ?? '-'}`
}

// @ts-expect-error: a policy is binpack, spread or firstfit
fleet.place(machine, { policy: 'random' })
const whatIf: Placement = fleet.place({ ...machine, targetNode: 'node-a' }, { policy: 'firstfit', dryRun: true })
void whatIf
// @ts-expect-error: device requests need a name
const unnamed: Machine = { name: 'vm', devices: [{ profile: 'A2-4Q' }] }
// @ts-expect-error: GPU states are free, in-use or blocked
const state: NodeTopology['gpus'][number]['state'] = 'busy'

void [freeGpus, offered, allocations, async, later, reports, plan, copy, explain, unnamed, state]
