// The Node side of the cross-front-end error cases (tests/error-cases.json): every bad input
// throws the `code` and `errorKind` the CLI and the Python package report for it too.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import gpuslice from './gpuslice.mjs'

const { cases } = JSON.parse(readFileSync(new URL('../../../tests/error-cases.json', import.meta.url), 'utf8'))

function run(c, dir) {
  switch (c.call) {
    case 'place':
      return gpuslice.Fleet.fromJSON(c.fleet).place(c.machine)
    case 'layout':
      return gpuslice.planVgpuConfig(c.layout, c.config, c.topology)
    case 'policy': {
      const root = join(dir, 'root')
      mkdirSync(join(root, 'sys'), { recursive: true })
      return gpuslice.health({ root, policy: c.policy })
    }
    case 'discover':
      return gpuslice.discover({ root: c.root })
    default:
      throw new Error(`unknown call ${c.call}`)
  }
}

test('there are six cases', () => {
  assert.equal(cases.length, 7)
})

for (const c of cases) {
  test(`${c.name} throws the code and kind every front-end agrees on`, () => {
    const dir = mkdtempSync(join(tmpdir(), 'gpuslice-errorcase-'))
    try {
      assert.throws(() => run(c, dir), { code: c.node, errorKind: c.kind })
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
}
