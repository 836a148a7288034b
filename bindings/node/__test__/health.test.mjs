import { test, beforeEach, afterEach } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'

import gpuslice from './gpuslice.mjs'
import { twoGpuHost } from './hosttree.mjs'

let host
beforeEach(() => {
  host = twoGpuHost()
})
afterEach(() => host.remove())

const narrowRadeonLink = () => host.file('sys/devices/pci0000:00/0000:af:00.0/current_link_width', '8\n')
const verdicts = (reports) => Object.fromEntries(reports.map((r) => [r.name, r.health.state]))

test('health reports every GPU with its verdict and signals', () => {
  const reports = gpuslice.health({ root: host.root })

  assert.deepEqual(reports.map((r) => r.name), ['nvidia0', 'radeon0'])
  for (const r of reports) {
    assert.equal(r.health.state, 'Healthy')
    assert.deepEqual(r.signals.link.currentWidth, { value: 16 })
  }
})

test('health grades a link trained below its width as Degraded', () => {
  narrowRadeonLink()

  const reports = gpuslice.health({ root: host.root })

  assert.deepEqual(verdicts(reports), { nvidia0: 'Healthy', radeon0: 'Degraded' })
  assert.ok(reports[1].health.reasons.length > 0)
})

test('health applies a policy given as an object, as text or as a file', () => {
  narrowRadeonLink()
  const policyFile = path.join(host.root, 'policy.json')
  fs.writeFileSync(policyFile, JSON.stringify({ link: { judgeWidth: false } }))

  for (const options of [
    { policy: { link: { judgeWidth: false } } },
    { policy: 'link: {judgeWidth: false}\n' },
    { policyFile },
  ]) {
    const reports = gpuslice.health({ root: host.root, ...options })
    assert.equal(verdicts(reports).radeon0, 'Healthy', JSON.stringify(options))
  }
})

test('health rejects an unknown policy key with CONFIG_ERROR', () => {
  assert.throws(() => gpuslice.health({ root: host.root, policy: { colour: 'red' } }), {
    code: 'CONFIG_ERROR',
    message: /colour/,
  })
})

test('health with a missing policy file throws HOST_ERROR with path and errno', () => {
  const policyFile = path.join(host.root, 'missing.toml')

  assert.throws(() => gpuslice.health({ root: host.root, policyFile }), {
    code: 'HOST_ERROR',
    path: policyFile,
    errno: 2,
  })
})

test('health of a missing root throws HOST_ERROR', () => {
  assert.throws(() => gpuslice.health({ root: '/nonexistent-gpuslice-root' }), { code: 'HOST_ERROR' })
})
