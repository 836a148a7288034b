// Benchmark: refusals and a scheduler's mixed loop through Node (issue 31); the Node twin of
// bindings/python/bench/bench_refusal.py.
//
// Builds a fleet of NODES nodes of one discovered host (the binding's two-GPU test host, a T4
// with mdev vGPUs and a free AMD GPU) with `Fleet.addNodes`, then times, by median of wall-clock
// time per call:
//
// - `Fleet.place` of a Machine that fits (a dry run);
// - a refused `Fleet.place` (a vGPU count no node holds), the error caught and dropped;
// - the first place after a refusal;
// - a mixed loop of OPS operations: 70% place, 20% refused place, 10% release, as a scheduler
//   trying Machines runs it.
//
// Build the addon first (`npm run build:release`), then:
//   node bench/bench_refusal.mjs [NODES] [OPS]
import { createRequire } from 'node:module'

import { twoGpuHost } from '../__test__/hosttree.mjs'

const require = createRequire(import.meta.url)
const gpuslice = require('../index.js')
const { Fleet } = gpuslice

const FITS = { name: 'vm', devices: [{ name: 'gpu', profile: 'T4-4C' }] }
const REFUSED = { name: 'no', devices: [{ name: 'gpu', profile: 'T4-4C', count: 999 }] }

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

const now = () => process.hrtime.bigint()

// Median microseconds of `rounds` calls of `f`.
const timed = (f, rounds) => {
  const out = []
  for (let i = 0; i < rounds; i++) {
    const start = now()
    f()
    out.push(Number(now() - start))
  }
  return median(out) / 1000
}

const refuse = (fleet) => {
  try {
    fleet.place(REFUSED)
  } catch (err) {
    if (err.code !== 'UNSATISFIABLE') throw err
  }
}

const nodes = Number(process.argv[2] ?? 10000)
const ops = Number(process.argv[3] ?? 10000)
const host = twoGpuHost()
let topology
try {
  topology = gpuslice.discover({ root: host.root, node: 'proto' })
} finally {
  host.remove()
}
const fleet = new Fleet()
const names = Array.from({ length: nodes }, (_, i) => `node-${String(i).padStart(5, '0')}`)
const buildStart = now()
fleet.addNodes(topology, names)
const built = Number(now() - buildStart) / 1e9

const place = timed(() => fleet.place(FITS, { dryRun: true }), 2000)
const refused = timed(() => refuse(fleet), 200)
const afterOne = () => {
  refuse(fleet)
  const start = now()
  fleet.place(FITS, { dryRun: true })
  return Number(now() - start)
}
const after = median(Array.from({ length: 200 }, afterOne)) / 1000

// A seeded generator (mulberry32) so each run draws the same operations.
let seed = 7
const random = () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const placed = []
const mixedStart = now()
for (let i = 0; i < ops; i++) {
  const r = random()
  if (r < 0.7) {
    const name = `m-${i}`
    try {
      fleet.place({ name, devices: [{ name: 'gpu', profile: 'T4-4C' }] })
      placed.push(name)
    } catch (err) {
      if (err.code !== 'UNSATISFIABLE') throw err
    }
  } else if (r < 0.9) {
    refuse(fleet)
  } else if (placed.length > 0) {
    const [name] = placed.splice(Math.floor(random() * placed.length), 1)
    fleet.release(name)
  }
}
const mixed = Number(now() - mixedStart) / ops / 1000

const f = (x) => x.toFixed(1).padStart(10)
console.log(`fleet: ${nodes} nodes of one discovered host, built in ${built.toFixed(2)} s (addNodes)`)
console.log(`place (dry run), median:            ${f(place)} us`)
console.log(`refused place, median:              ${f(refused)} us (${(refused / place).toFixed(1)}x place)`)
console.log(`place right after a refusal:        ${f(after)} us`)
console.log(`mixed loop 70/20/10, ${ops} ops:     ${f(mixed)} us per operation`)
