// Benchmark: placements, refusals and a scheduler's mixed loop through Node (issue 31); the
// Node twin of bindings/python/bench/bench_refusal.py.
//
// The fleet is built the way a user builds one from real hosts: `discover` on four discovered
// host trees (an L40S with 16 vendor-VFIO VFs, an A2 with 16 mdev VFs, an 8-GPU H200 in MIG
// mode, a whole-GPU passthrough host; written by the `host_trees` example of the benches crate),
// then `Fleet.addNode` NODES times, the four shapes in turn, each under its own name. It times,
// by median of wall-clock time per call:
//
// - `Fleet.place` of a Machine that fits (a dry run; the four hosts' Machines in turn);
// - a refused `Fleet.place` (a count no node holds, of each host's profile in turn), the error
//   caught and dropped;
// - the first place after a refusal;
// - a mixed loop of OPS operations: 70% place, 20% refused place, 10% release (seeded), as a
//   scheduler trying Machines runs it: per operation in wall-clock time and in the process's CPU
//   time (on a shared machine other jobs' time slices land in the wall figure; the process
//   figure includes V8's garbage-collector threads), and the median of each kind inside it.
//
// Build the addon first (`npm run build:release`), then:
//   cargo run --release -p gpuslice-benches --example host_trees -- /tmp/gpuslice-hosts
//   node bench/bench_refusal.mjs /tmp/gpuslice-hosts [NODES] [OPS]
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { loadavg } from 'node:os'
import { join } from 'node:path'

const require = createRequire(import.meta.url)
const gpuslice = require('../index.js')
const { Fleet } = gpuslice

const HOSTS = ['l40s', 'a2', 'h200', 'whole']
const FITS = {
  l40s: { name: 'gpu', profile: 'L40S-8Q' },
  a2: { name: 'gpu', profile: 'A2-4Q' },
  h200: { name: 'gpu', profile: 'H200X-1-18C' },
  whole: { name: 'gpu', vendor: 'nvidia' },
}
const REFUSED = HOSTS.map((h) => ({ name: `no-${h}`, devices: [{ ...FITS[h], count: 999 }] }))
const machine = (name, host) => ({ name, devices: [FITS[host]] })

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

const now = () => process.hrtime.bigint()

// Median microseconds of `rounds` calls of `f(k)`.
const timed = (f, rounds) => {
  const out = []
  for (let k = 0; k < rounds; k++) {
    const start = now()
    f(k)
    out.push(Number(now() - start))
  }
  return median(out) / 1000
}

const refuse = (fleet, k) => {
  const m = REFUSED[k % REFUSED.length]
  try {
    fleet.place(m)
  } catch (err) {
    if (err.code !== 'UNSATISFIABLE') throw err
    return
  }
  throw new Error(`${m.name} was placed`)
}

const hostsDir = process.argv[2]
if (!hostsDir) {
  console.error('usage: node bench/bench_refusal.mjs HOSTS_DIR [NODES] [OPS]')
  process.exit(2)
}
const nodes = Number(process.argv[3] ?? 10000)
const ops = Number(process.argv[4] ?? 10000)
const loadBefore = loadavg()[0]
const protos = {}
for (const h of HOSTS) {
  const root = join(hostsDir, h)
  if (!existsSync(root)) {
    console.error(
      `${root} is missing: write the trees with ` +
        `\`cargo run --release -p gpuslice-benches --example host_trees -- ${hostsDir}\``,
    )
    process.exit(2)
  }
  protos[h] = gpuslice.discover({ root, node: 'proto' })
}
const fleet = new Fleet()
const buildStart = now()
for (let i = 0; i < nodes; i++) {
  const h = HOSTS[i % HOSTS.length]
  fleet.addNode({ ...protos[h], node: `${h}-${String(i).padStart(5, '0')}` })
}
const built = Number(now() - buildStart) / 1e9

const place = timed((k) => fleet.place(machine('vm', HOSTS[k % 4]), { dryRun: true }), 2000)
const refused = timed((k) => refuse(fleet, k), 400)
const afterOne = (k) => {
  refuse(fleet, k)
  const start = now()
  fleet.place(machine('vm', HOSTS[k % 4]), { dryRun: true })
  return Number(now() - start)
}
const after = median(Array.from({ length: 400 }, (_, k) => afterOne(k))) / 1000

// A seeded generator (mulberry32) so each run draws the same operations.
let seed = 7
const random = () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const pick = (n) => Math.floor(random() * n)
const placed = []
const kinds = { place: [], refuse: [], release: [] }
const mixedStart = now()
const cpuStart = process.cpuUsage()
for (let i = 0; i < ops; i++) {
  const r = random()
  const t = now()
  if (r < 0.7) {
    const name = `m-${i}`
    try {
      fleet.place(machine(name, HOSTS[pick(4)]))
      placed.push(name)
    } catch (err) {
      if (err.code !== 'UNSATISFIABLE') throw err
    }
    kinds.place.push(Number(now() - t))
  } else if (r < 0.9) {
    refuse(fleet, pick(4))
    kinds.refuse.push(Number(now() - t))
  } else if (placed.length > 0) {
    const [name] = placed.splice(pick(placed.length), 1)
    fleet.release(name)
    kinds.release.push(Number(now() - t))
  }
}
const mixed = Number(now() - mixedStart) / ops / 1000
const cpu = process.cpuUsage(cpuStart)
const mixedCpu = (cpu.user + cpu.system) / ops
const loadAfter = loadavg()[0]

const f = (x) => x.toFixed(1).padStart(10)
const shapes = HOSTS.map(
  (h) => `${h} ${protos[h].gpus.length} GPUs/${protos[h].mediatedDevices.parents.length} parents`,
).join(', ')
console.log(`fleet: ${nodes} nodes of 4 discovered hosts (${shapes}), addNode in ${built.toFixed(2)} s`)
console.log(`load average (1 min): ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after`)
console.log(`place (dry run), median:            ${f(place)} us`)
console.log(`refused place, median:              ${f(refused)} us (${(refused / place).toFixed(1)}x place)`)
console.log(`place right after a refusal:        ${f(after)} us`)
console.log(`mixed loop 70/20/10, ${ops} ops:     ${f(mixed)} us per operation (wall)`)
console.log(`  the same in process CPU time:     ${f(mixedCpu)} us per operation`)
console.log(
  '  in the loop, medians: ' +
    Object.entries(kinds)
      .filter(([, v]) => v.length > 0)
      .map(([k, v]) => `${k} ${(median(v) / 1000).toFixed(1)} us`)
      .join(', '),
)
