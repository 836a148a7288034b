import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

import gpuslice from './gpuslice.mjs'

const packageDir = path.dirname(path.dirname(fileURLToPath(import.meta.url)))

test('the addon reports the core version', () => {
  assert.equal(gpuslice.version(), '0.1.0')
})

test('the package exports the whole API', () => {
  for (const name of ['discover', 'discoverAsync', 'health', 'planVgpuConfig', 'Fleet', 'version']) {
    assert.equal(typeof gpuslice[name], 'function', name)
  }
  for (const name of [
    'addNode', 'removeNode', 'place', 'placeAsync', 'release', 'markCreated',
    'planMigration', 'planDrain', 'planEvacuation', 'allocations', 'toJSON',
  ]) {
    assert.equal(typeof gpuslice.Fleet.prototype[name], 'function', name)
  }
  assert.equal(typeof gpuslice.Fleet.fromJSON, 'function')
})

test('the type definitions describe the documents precisely', () => {
  const dts = fs.readFileSync(path.join(packageDir, 'index.d.ts'), 'utf8')

  for (const shape of ['NodeTopology', 'Machine', 'Allocation', 'Placement', 'FleetDocument', 'Refusal', 'VgpuPlan']) {
    assert.match(dts, new RegExp(`export interface ${shape} `), shape)
  }
  const code = dts.replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '')
  assert.doesNotMatch(code, /\bany\b/)
  assert.match(dts, /place\(machine: Machine \| string, options\?: PlaceOptions\): Placement/)
})

test('the package manifest is ready to publish', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(packageDir, 'package.json'), 'utf8'))

  assert.equal(pkg.name, 'gpuslice')
  assert.equal(pkg.license, 'Apache-2.0')
  assert.equal(pkg.types, 'index.d.ts')
  assert.ok(pkg.description)
  assert.match(pkg.repository.url, /github\.com\/gpuslice\/gpuslice/)
  assert.ok(pkg.files.includes('index.d.ts'))
})
