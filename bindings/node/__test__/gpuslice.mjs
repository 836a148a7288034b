// Loads the built addon through the package's generated loader.
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
export default require('../index.js')
