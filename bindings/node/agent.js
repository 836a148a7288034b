// A client for the gpuslice node agent's API (`gpuslice agent`) over its unix socket: plain
// JavaScript on node:http, so an orchestrator in Node needs no HTTP code of its own. Written by
// hand (not generated); `main.js` exports it next to the native API.
//
// Reads ask for gzip, and the client keeps the last topology and health documents with their
// entity tags: polling an unchanged agent costs a `304 Not Modified` and no transfer of the document.
'use strict'

const http = require('node:http')
const zlib = require('node:zlib')

const DEFAULT_SOCKET = '/run/gpuslice/agent.sock'
// The reads the agent serves with entity tags; the client keeps the last answer of each.
const CACHED_PATHS = new Set(['/v1/topology', '/v1/health'])

/** An error document from the agent; `kind` is the same string as `gpuslice -o json`. */
class AgentError extends Error {
  constructor(status, kind, message, errno) {
    super(`${message} (${kind}, HTTP ${status})`)
    this.name = 'AgentError'
    this.status = status
    this.kind = kind
    this.errno = errno
  }
}

class AgentClient {
  constructor(options = {}) {
    this.socket = options.socket || DEFAULT_SOCKET
    this.timeoutMs = options.timeoutMs || 60000
    // path -> { etag, text } of the last cached read of that path.
    this.cached = new Map()
  }

  request(method, path, body, contentType) {
    return new Promise((resolve, reject) => {
      const data = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body)
      const headers = { 'Accept-Encoding': 'gzip' }
      const cached = method === 'GET' ? this.cached.get(path) : undefined
      if (cached) headers['If-None-Match'] = cached.etag
      if (data !== undefined) {
        headers['Content-Type'] = contentType || 'application/json'
        headers['Content-Length'] = Buffer.byteLength(data)
      }
      const req = http.request({ socketPath: this.socket, method, path, headers, timeout: this.timeoutMs }, (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => {
          if (res.statusCode === 304 && cached) {
            resolve(JSON.parse(cached.text))
            return
          }
          let text
          try {
            const body = Buffer.concat(chunks)
            text = (res.headers['content-encoding'] === 'gzip' ? zlib.gunzipSync(body) : body).toString('utf8')
          } catch (e) {
            reject(e)
            return
          }
          const json = (res.headers['content-type'] || '').startsWith('application/json')
          if (method === 'GET' && res.statusCode === 200 && res.headers.etag && CACHED_PATHS.has(path)) {
            this.cached.set(path, { etag: res.headers.etag, text })
          }
          if (res.statusCode >= 400) {
            try {
              const e = JSON.parse(text).error
              reject(new AgentError(res.statusCode, e.kind, e.message, e.errno))
            } catch {
              reject(new AgentError(res.statusCode, 'error', text.trim() || res.statusMessage))
            }
            return
          }
          try {
            resolve(json ? JSON.parse(text) : text)
          } catch (e) {
            reject(e)
          }
        })
      })
      req.on('timeout', () => req.destroy(new Error(`the agent did not answer within ${this.timeoutMs} ms`)))
      req.on('error', reject)
      if (data !== undefined) req.write(data)
      req.end()
    })
  }

  topology() { return this.request('GET', '/v1/topology') }
  health() { return this.request('GET', '/v1/health') }
  vgpus() { return this.request('GET', '/v1/vgpus') }
  promises() { return this.request('GET', '/v1/promises') }
  metrics() { return this.request('GET', '/metrics') }

  create(request) { return this.request('POST', '/v1/vgpus', request) }

  remove(target, options = {}) {
    return this.request('DELETE', `/v1/vgpus/${encodeURIComponent(target)}${options.force ? '?force=true' : ''}`)
  }

  bind(gpu, options = {}) {
    return this.request('POST', `/v1/gpus/${encodeURIComponent(gpu)}/bind${options.force ? '?force=true' : ''}`)
  }

  release(gpu, options = {}) {
    return this.request('POST', `/v1/gpus/${encodeURIComponent(gpu)}/release${options.force ? '?force=true' : ''}`)
  }

  /** `POST /v1/realize`: a placed Machine's devices made on this node (`allocation`: the
   * document `gpuslice place` prints, as text or an object). */
  realize(allocation, options = {}) {
    const q = new URLSearchParams()
    if (options.machine) q.set('machine', options.machine)
    if (options.force) q.set('force', 'true')
    const qs = q.toString()
    const path = `/v1/realize${qs ? `?${qs}` : ''}`
    if (typeof allocation === 'string') return this.request('POST', path, allocation, 'application/yaml')
    return this.request('POST', path, allocation)
  }

  applyLayout(layout, options = {}) {
    const q = new URLSearchParams()
    if (options.config) q.set('config', options.config)
    if (options.dryRun) q.set('dryRun', 'true')
    if (options.force) q.set('force', 'true')
    const qs = q.toString()
    return this.request('PUT', `/v1/layout${qs ? `?${qs}` : ''}`, layout, 'application/yaml')
  }

  /** Calls `onEvent` for each change after revision `since`; returns a function that stops. */
  events(since, onEvent, onError) {
    const req = http.request({ socketPath: this.socket, method: 'GET', path: `/v1/events?since=${Number(since) || 0}&format=ndjson` }, (res) => {
      let buf = ''
      res.setEncoding('utf8')
      res.on('data', (c) => {
        buf += c
        let i
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i).trim()
          buf = buf.slice(i + 1)
          if (line) onEvent(JSON.parse(line))
        }
      })
    })
    req.on('error', (e) => { if (onError) onError(e) })
    req.end()
    return () => req.destroy()
  }
}

module.exports = { AgentClient, AgentError, DEFAULT_SOCKET }
