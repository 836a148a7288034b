// Every ```js block of the guide runs as written (CommonJS, `node -e`), from the repository's
// root; `require('gpuslice')` finds this checkout's package, as it would once installed. A
// block's standalone comment lines (`// text`) show what it prints: each must appear in its
// output.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, readFileSync, symlinkSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import os from 'node:os'
import path from 'node:path'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
const pages = ['README.md', 'docs/bindings.md', 'bindings/node/README.md']
const modules = path.join(mkdtempSync(path.join(os.tmpdir(), 'gpuslice-doc-')), 'node_modules')
mkdirSync(modules)
symlinkSync(path.join(root, 'bindings/node'), path.join(modules, 'gpuslice'))

for (const page of pages) {
  const text = readFileSync(path.join(root, page), 'utf8')
  const found = [...text.matchAll(/^```js\n([\s\S]*?)^```/gm)]
  test(`${page} shows a js block`, () => assert.ok(found.length > 0))
  for (const m of found) {
    const line = text.slice(0, m.index).split('\n').length
    test(`${page}:${line} runs as written`, () => {
      const r = spawnSync(process.execPath, ['-e', m[1]], {
        cwd: root,
        env: { ...process.env, NODE_PATH: modules },
        encoding: 'utf8',
        timeout: 120000,
      })
      assert.equal(r.status, 0, r.stderr)
      const out = r.stdout + r.stderr
      assert.ok(out.trim(), 'the snippet prints nothing')
      assert.doesNotMatch(out, /\[object Object\]/)
      for (const [, shown] of m[1].matchAll(/^\s*\/\/ (.+)$/gm)) {
        assert.ok(out.includes(shown), `${JSON.stringify(shown)} not printed:\n${out}`)
      }
    })
  }
}
