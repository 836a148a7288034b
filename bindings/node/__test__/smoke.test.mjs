import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const gpuslice = require('../index.js')

test('the addon reports its version', () => {
  assert.equal(gpuslice.version(), '0.1.0')
})
