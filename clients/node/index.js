'use strict';
// delayq's reference producer for Node: schedule, scheduleMany, cancel, reschedule and get on
// a delayq queue, following delayq protocol v1 (docs/protocol.md) with the scripts of
// `delayq protocol export` (./protocol). A Python delayq worker runs what it schedules.

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const { crc32 } = require('./crc32');
const { isCluster, clusterOptions, clusterCall } = require('./cluster');

const PROTOCOL_DIR = path.join(__dirname, 'protocol');
const MANIFEST = JSON.parse(fs.readFileSync(path.join(PROTOCOL_DIR, 'manifest.json'), 'utf8'));
const PROTOCOL_VERSION = MANIFEST.protocol;

const SCRIPTS = {};
for (const entry of MANIFEST.scripts) {
  const source = fs.readFileSync(path.join(PROTOCOL_DIR, entry.file));
  const sha1 = crypto.createHash('sha1').update(source).digest('hex');
  if (sha1 !== entry.sha1) {
    throw new Error(
      `protocol/${entry.file} has SHA-1 ${sha1}, not the manifest's ${entry.sha1}: ` +
        'export the scripts again (python -m delayq protocol export protocol)'
    );
  }
  SCRIPTS[entry.name] = { ...entry, source: source.toString('utf8') };
}

// The limits a delayq producer checks before it writes (docs/protocol.md, "Records").
const MAX_ID_LEN = 256;
const MAX_KIND_LEN = 200;
const MAX_ATTEMPTS = 1000000;
const MAX_HEADERS = 4096;
const DEFAULT_MAX_PAYLOAD = 64 * 1024;
const DEFAULT_DEDUPE_WINDOW = 86400; // seconds
const MAX_DELAY_S = 10 * 365 * 24 * 3600;
const MAX_AT_S = 253402300799; // 9999-12-31T23:59:59Z
const SCHEDULE_BATCH = 1000; // tasks per script call
const TRIM_LIMIT = 100; // tombstones of past cancels a cancel forgets at most (delayq's ABORT_TRIM)
const HOME_ID_PREFIXES = ['cron:', 'x:']; // ids that stay on shard 0
const STATUS = { 0: 'unchanged', 1: 'created', 2: 'replaced', 3: 'running' };

class DelayqError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}
class ConfigurationError extends DelayqError {}
class InvalidTaskError extends DelayqError {}
class ProtocolVersionError extends ConfigurationError {
  constructor(message, { queue, stored, ours }) {
    super(message);
    Object.assign(this, { queue, stored, ours });
  }
}

function parseVersion(text) {
  const m = /^(\d+)(?:\.(\d+))?$/.exec(text);
  return m ? [Number(m[1]), Number(m[2] || 0)] : null;
}

const [MAJOR] = parseVersion(PROTOCOL_VERSION);

/** Refuse a queue whose stored protocol version is of another major ('' is unstamped: 1). */
function checkProtocol(queue, stored) {
  const version = stored ? parseVersion(stored) : [1, 0];
  if (version && version[0] === MAJOR) return;
  const ours = PROTOCOL_VERSION;
  let message;
  if (!version) {
    message =
      `queue '${queue}' carries the protocol version '${stored}', which is not one (this ` +
      `client speaks ${ours}): the queue's keys were not written by delayq`;
  } else if (version[0] > MAJOR) {
    message =
      `queue '${queue}' speaks delayq protocol ${stored}; this client speaks ${ours}: ` +
      `upgrade the client to one that speaks protocol ${version[0]}`;
  } else {
    message =
      `queue '${queue}' speaks delayq protocol ${stored}, an older major than this ` +
      `client's ${ours}: use a client of protocol ${version[0]}`;
  }
  throw new ProtocolVersionError(message, { queue, stored, ours });
}

function codePoints(text) {
  return [...text].length;
}

/** Whether text is over ``limit`` characters (code points, as Python counts them). */
function tooLong(text, limit) {
  return text.length > limit && codePoints(text) > limit; // (never more points than units)
}

function checkText(value, what) {
  if (!value.isWellFormed()) {
    throw new InvalidTaskError(`${what} ${JSON.stringify(value)} holds a lone surrogate`);
  }
  return value;
}

function validateTaskId(id) {
  if (typeof id !== 'string' || id === '') {
    throw new InvalidTaskError(`taskId must be a non-empty string, got ${JSON.stringify(id)}`);
  }
  if (tooLong(id, MAX_ID_LEN)) {
    throw new InvalidTaskError(
      `taskId is ${codePoints(id)} characters, over the limit of ${MAX_ID_LEN}; use a ` +
        "shorter business key such as 'order:42'"
    );
  }
  if (/[\u0000-\u001f]/.test(id)) {
    throw new InvalidTaskError(`taskId ${JSON.stringify(id)} contains control characters`);
  }
  return checkText(id, 'taskId');
}

function validateKind(kind) {
  if (typeof kind !== 'string' || kind === '' || tooLong(kind, MAX_KIND_LEN)) {
    throw new InvalidTaskError(
      `kind must be a non-empty string of at most ${MAX_KIND_LEN} characters, got ` +
        JSON.stringify(kind)
    );
  }
  if (/[\u0000-\u001f]/.test(kind)) {
    throw new InvalidTaskError(`kind ${JSON.stringify(kind)} contains control characters`);
  }
  return checkText(kind, 'kind');
}

function validateMaxAttempts(value) {
  if (!Number.isInteger(value) || value < 0 || value > MAX_ATTEMPTS) {
    throw new InvalidTaskError(
      `maxAttempts must be a whole number from 0 (the handler's limit) to ${MAX_ATTEMPTS}, ` +
        `got ${JSON.stringify(value)}`
    );
  }
  return value;
}

/** A task's priority: a whole number 0-9 (the higher claimed first among due tasks). */
function validatePriority(value) {
  if (!Number.isInteger(value) || value < 0 || value > 9) {
    throw new InvalidTaskError(
      `priority must be a whole number from 0 to 9 (the higher claimed first among due ` +
        `tasks; 0 is none), got ${JSON.stringify(value)}`
    );
  }
  return value;
}

function encodeHeaders(headers) {
  if (headers == null) return '';
  if (typeof headers !== 'object' || Array.isArray(headers)) {
    throw new InvalidTaskError('headers must be an object of strings, e.g. {tenant: "a"}');
  }
  const names = Object.keys(headers);
  if (names.length === 0) return '';
  for (const name of names) {
    if (name === '') throw new InvalidTaskError('header names must be non-empty strings');
    if (typeof headers[name] !== 'string') {
      throw new InvalidTaskError(
        `header '${name}' has a ${typeof headers[name]} value; header values must be ` +
          'strings: convert it with String() (or JSON.stringify for structure)'
      );
    }
    checkText(name, 'header name');
    checkText(headers[name], `header '${name}'`);
  }
  const json = JSON.stringify(headers);
  if (Buffer.byteLength(json) > MAX_HEADERS) {
    throw new InvalidTaskError(
      `headers are ${Buffer.byteLength(json)} bytes encoded, over the limit of ${MAX_HEADERS}`
    );
  }
  return `,"h":${json}`;
}

function seconds(value, what) {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw new InvalidTaskError(`${what} must be a finite number of seconds, got ${value}`);
  }
  if (value < 0) throw new InvalidTaskError(`${what} must not be negative, got ${value}`);
  if (value > MAX_DELAY_S) {
    throw new InvalidTaskError(`${what} of ${value} s is over ten years; check the unit`);
  }
  return value;
}

/** The due argument: "+<ms>" from the server's now, or absolute ms (to the microsecond). */
function dueSpec(delay, at) {
  if (delay != null && at != null) throw new InvalidTaskError('pass either delay or at, not both');
  if (at != null) {
    const ts = at instanceof Date ? at.getTime() / 1000 : at;
    if (typeof ts !== 'number' || !Number.isFinite(ts) || ts < 0) {
      throw new InvalidTaskError(`at must be a Date or a Unix timestamp in seconds, got ${at}`);
    }
    if (ts > MAX_AT_S) throw new InvalidTaskError(`at=${at} is beyond year 9999; milliseconds?`);
    const ms = Math.round(ts * 1e6) / 1e3;
    return Number.isInteger(ms) ? String(ms) : ms.toFixed(3);
  }
  return '+' + String(Math.round(seconds(delay == null ? 0 : delay, 'delay') * 1000));
}

/** Ids of 96 random bits in 16 URL-safe characters, never starting with '-'; one read of
 * the random source for the whole batch. */
function newTaskIds(n) {
  const raw = crypto.randomBytes(12 * n).toString('base64url');
  const ids = new Array(n);
  for (let i = 0; i < n; i++) {
    const id = raw.slice(16 * i, 16 * i + 16);
    ids[i] = id[0] === '-' ? '_' + id.slice(1) : id;
  }
  return ids;
}

function shardOf(taskId, n) {
  if (n === 1 || HOME_ID_PREFIXES.some((p) => taskId.startsWith(p))) return 0;
  return crc32(Buffer.from(taskId, 'utf8')) % n;
}

/**
 * The due time (ms) the scripts store for a due argument when they run at `now`, the now
 * schedule replies after its statuses (protocol 1.1): lib/due.lua's dq_due.
 */
function storedDue(due, now) {
  if (due[0] === 'p') due = due.slice(3); // "p<N>:<due>": a priority given
  return due[0] === '+' ? Number(now) + Number(due.slice(1)) : Number(due);
}

function msToDate(ms) {
  return ms == null ? null : new Date(Number(ms));
}

/** SCRIPT LOAD by ``send`` (a node's sendCommand), checking the SHA-1 the server made. */
async function loadScript(script, send) {
  const sha1 = await send(['SCRIPT', 'LOAD', script.source]);
  if (sha1 !== script.sha1) {
    throw new DelayqError(`the server loaded ${script.name} as ${sha1}, not ${script.sha1}`);
  }
}

/**
 * The client a Queue makes: createCluster's for redis+cluster:// or root nodes, else
 * createClient's for the URL (else $DELAYQ_REDIS_URL, $REDIS_URL, localhost:6379).
 */
function connect(url, rootNodes) {
  const { createClient, createCluster } = require('redis');
  if (rootNodes != null) {
    if (!Array.isArray(rootNodes) || rootNodes.length === 0) {
      throw new ConfigurationError(
        "rootNodes must be a non-empty array of a cluster's nodes, e.g. " +
          "[{url: 'redis://10.0.0.1:7000'}] or ['redis://10.0.0.1:7000']"
      );
    }
    return createCluster({
      rootNodes: rootNodes.map((node) => (typeof node === 'string' ? { url: node } : node)),
    });
  }
  const target = url || process.env.DELAYQ_REDIS_URL || process.env.REDIS_URL;
  if (target != null && typeof target !== 'string') {
    throw new ConfigurationError(`url must be a Redis URL string, got ${JSON.stringify(target)}`);
  }
  const cluster = target ? clusterOptions(target, (m) => new ConfigurationError(m)) : null;
  return cluster ? createCluster(cluster) : createClient({ url: target });
}

class Queue {
  /**
   * A delayq queue, for producing.
   *
   * @param {string} name the queue's name (1-100 of letters, digits and '_.:-').
   * @param {object} options
   * @param {object} [options.client] a connected client of the npm package `redis` v4
   *   (yours to close): createClient's, or createCluster's for a Redis Cluster; or
   * @param {string} [options.url] a Redis URL to connect to (closed by close()):
   *   redis://..., or redis+cluster://host:port[,host:port...] for a cluster; or
   * @param {Array<object|string>} [options.rootNodes] a Redis Cluster's root nodes, as
   *   createCluster takes them ({url: 'redis://host:port'}) or as URLs (closed by close()).
   * @param {number|'stored'} [options.shards=1] as every process of the queue uses it;
   *   'stored': the count the queue stored (1 if none).
   * @param {string} [options.prefix='dq'] the keys' first part.
   * @param {number} [options.dedupeWindow] seconds a finished id is remembered: the
   *   queue's setting when it stores one (`delayq settings`), else 86400.
   * @param {number} [options.maxPayload] largest encoded payload, in bytes: the queue's
   *   setting when it stores one, else 65536. Either, given and different from the queue's
   *   stored setting, is refused (ConfigurationError naming both) on the first call.
   */
  constructor(name, options = {}) {
    const { client, url, rootNodes, shards = 1, prefix = MANIFEST.default_prefix } = options;
    if (typeof name !== 'string' || !/^[A-Za-z0-9_.:-]{1,100}$/.test(name)) {
      throw new ConfigurationError(
        `invalid queue name ${JSON.stringify(name)}: use 1-100 characters from letters, ` +
          "digits and '_.:-'"
      );
    }
    if (
      shards !== 'stored' &&
      !(Number.isInteger(shards) && shards >= 1 && shards <= MANIFEST.max_shards)
    ) {
      throw new ConfigurationError(
        `shards must be an integer from 1 to ${MANIFEST.max_shards} or 'stored', got ${shards}`
      );
    }
    this.name = name;
    this.prefix = prefix;
    this.stored = shards === 'stored';
    this.n = this.stored ? 1 : shards;
    // The queue's settings (docs/protocol.md, "Settings"): what was given (null: not given)
    // until the queue's stored ones are read with its shard count (shards.lua's reply).
    this.given = {
      dedupeMs:
        options.dedupeWindow == null
          ? null
          : Math.round(seconds(options.dedupeWindow, 'dedupeWindow') * 1000),
      maxPayload: options.maxPayload ?? null,
    };
    if (
      this.given.maxPayload !== null &&
      !(Number.isInteger(this.given.maxPayload) && this.given.maxPayload >= 1)
    ) {
      throw new ConfigurationError(
        `maxPayload must be a positive byte count, got ${this.given.maxPayload}`
      );
    }
    this.dedupeMs = this.given.dedupeMs ?? DEFAULT_DEDUPE_WINDOW * 1000;
    this.maxPayload = this.given.maxPayload ?? DEFAULT_MAX_PAYLOAD;
    this.codec = 'json';
    this.storedSettings = [];
    this.settingsRead = 0; // how many times the settings changed since the queue was opened
    const given = [client, url, rootNodes].filter((o) => o != null).length;
    if (given > 1) {
      throw new ConfigurationError('pass one of client, url or rootNodes, not several');
    }
    if (client) {
      this.client = client;
      this.ownsClient = false;
    } else {
      this.client = connect(url, rootNodes);
      // Socket errors are emitted as the client reconnects; a call they cut fails itself.
      this.client.on('error', () => {});
      this.ownsClient = true;
      this.connecting = null;
    }
    // A Redis Cluster: each call goes to its first key's slot (cluster.js).
    this.cluster = isCluster(this.client);
    this.prefixes = new Map();
    this.checked = false; // reads skip the check once a count is stored
    this.writeChecked = false; // writes once the queue is also stamped
  }

  key(tag, attribute) {
    return `${this.prefix}:{${tag}}:${MANIFEST.keys[attribute]}`;
  }

  tag(shard) {
    return this.n === 1 ? this.name : `${this.name}#${shard}`;
  }

  async connection() {
    if (this.ownsClient && !this.client.isOpen) {
      this.connecting = this.connecting || this.client.connect();
      await this.connecting;
    }
    return this.client;
  }

  /**
   * One script call: EVALSHA, loading the script on NOSCRIPT and sending it again. On a
   * cluster, to the primary of the slot of its keys (one tag: one slot), loaded there.
   */
  async call(name, tag, args, rest = []) {
    const script = SCRIPTS[name];
    const given = Object.keys(args).sort().join(',');
    if (given !== [...script.argv].sort().join(',')) {
      throw new TypeError(`${name} takes ARGV ${script.argv.join(', ')}, got ${given}`);
    }
    const keys = script.keys.map((k) => this.key(tag, k));
    const argv = script.argv.map((a) => String(args[a]));
    const command = ['EVALSHA', script.sha1, String(keys.length), ...keys, ...argv, ...rest];
    const client = await this.connection();
    if (this.cluster) {
      return clusterCall(client, keys[0], command, (send) => loadScript(script, send));
    }
    try {
      return await client.sendCommand(command);
    } catch (err) {
      if (!String(err && err.message).startsWith('NOSCRIPT')) throw err;
      await loadScript(script, (args) => client.sendCommand(args));
      return client.sendCommand(command);
    }
  }

  /**
   * Once per queue object, before its first operation: the shard count (stored by the first
   * write; 'stored' adopts it) and the protocol version (stamped by the first write).
   */
  async check(store) {
    if (store ? this.writeChecked : this.checked) return;
    await this.shardCheck(store);
  }

  /** Run shards.lua on the unsplit queue's keys and refuse what the protocol refuses. */
  async shardCheck(store) {
    const reply = await this.call('shards', this.name, {
      want: this.n,
      store: store ? '1' : '0',
      protocol: PROTOCOL_VERSION,
    });
    if (!Array.isArray(reply)) {
      throw new ConfigurationError(
        `queue '${this.name}' is being resharded (the key ${this.key(this.name, 'shards')} ` +
          "has a 'moving' field): wait for `delayq reshard` to finish"
      );
    }
    const [count, protocol] = [Number(reply[0]), String(reply[1])];
    checkProtocol(this.name, protocol);
    this.adopt(reply.slice(2, 5).map((v) => (v == null ? '' : String(v))));
    if (count === 0) return protocol; // a read, and nothing stored yet: check again next time
    if (this.stored) {
      if (!(Number.isInteger(count) && count >= 1 && count <= MANIFEST.max_shards)) {
        throw new ConfigurationError(
          `queue '${this.name}' stored a shard count of ${count}, not one from 1 to the ` +
            `protocol's max_shards (${MANIFEST.max_shards}): no delayq process opens it; its key ` +
            `${this.key(this.name, 'shards')} was not written by delayq`
        );
      }
      this.n = count;
      this.stored = false;
    } else if (count !== this.n) {
      throw new ConfigurationError(
        `queue '${this.name}' is split into ${count} shard(s), but was opened with ` +
          `shards=${this.n}: open it with shards=${count}`
      );
    }
    this.checked = true;
    this.writeChecked = this.writeChecked || store || protocol !== '';
    return protocol;
  }

  /**
   * Follow the queue's stored settings ([dedupe_ms, max_payload, codec], each '' when not
   * stored; a queue of protocol 1.0 answers none): a setting given to the constructor must
   * agree with the stored one. This client encodes JSON only: a queue set to another codec
   * is refused.
   */
  adopt([dedupe = '', most = '', codec = '']) {
    const where = `\`delayq settings -q ${this.name}\``;
    const before = `${this.dedupeMs} ${this.maxPayload}`;
    const stored = [];
    if (dedupe !== '') {
      const ms = Number(dedupe);
      if (this.given.dedupeMs !== null && this.given.dedupeMs !== ms) {
        throw new ConfigurationError(
          `queue '${this.name}' stores dedupe_window=${ms / 1000}s (${where}), but was opened ` +
            `with dedupeWindow=${this.given.dedupeMs / 1000}s: leave dedupeWindow out to follow ` +
            "the queue's, or change the queue's with `delayq settings --dedupe-window`"
        );
      }
      this.dedupeMs = ms;
      stored.push('dedupe_window');
    }
    if (most !== '') {
      const bytes = Number(most);
      if (this.given.maxPayload !== null && this.given.maxPayload !== bytes) {
        throw new ConfigurationError(
          `queue '${this.name}' stores max_payload=${bytes} bytes (${where}), but was opened ` +
            `with maxPayload=${this.given.maxPayload} bytes: leave maxPayload out to follow ` +
            "the queue's, or change the queue's with `delayq settings --max-payload`"
        );
      }
      this.maxPayload = bytes;
      stored.push('max_payload');
    }
    if (codec !== '') {
      if (codec !== 'json') {
        throw new ConfigurationError(
          `queue '${this.name}' stores codec=${codec} (${where}); this client encodes JSON ` +
            'only: schedule on it from Python, or set the queue back with `--codec json`'
        );
      }
      stored.push('codec');
    }
    this.storedSettings = stored;
    if (`${this.dedupeMs} ${this.maxPayload}` !== before) this.settingsRead += 1;
  }

  /**
   * The settings this queue follows, read now (one round trip) with the checks of a first
   * call: {dedupeWindow (s), maxPayload (bytes), codec, stored (the names the queue
   * stores; the others are this client's or the defaults)}.
   */
  async settings() {
    await this.shardCheck(false);
    return {
      dedupeWindow: this.dedupeMs / 1000,
      maxPayload: this.maxPayload,
      codec: this.codec,
      stored: [...this.storedSettings],
    };
  }

  /** The queue's protocol version as stored ('' when it has none), after the checks. */
  async protocolVersion() {
    return this.shardCheck(false);
  }

  /** A record's header up to its created time, per kind, max attempts and priority (cached). */
  headerPrefix(kind, maxAttempts, priority = 0) {
    if (typeof kind !== 'string') validateKind(kind); // (throws: the cache holds strings)
    validateMaxAttempts(maxAttempts);
    const cacheKey = `${maxAttempts} ${priority} ${kind}`;
    let prefix = this.prefixes.get(cacheKey);
    if (prefix === undefined) {
      const header = { k: validateKind(kind) };
      if (maxAttempts) header.m = maxAttempts;
      if (priority) header.p = priority; // (protocol 1.1)
      prefix = JSON.stringify(header).slice(0, -1) + ',"c":';
      if (this.prefixes.size > 1000) this.prefixes.clear();
      this.prefixes.set(cacheKey, prefix);
    }
    return prefix;
  }

  /** Validate and encode one task: {id, due, record}. */
  encode(task, createdMs, generatedId) {
    if (task == null || typeof task !== 'object') {
      throw new InvalidTaskError(`a task is an object {kind, payload, ...}, got ${task}`);
    }
    const id = task.taskId == null ? generatedId : validateTaskId(task.taskId);
    // A priority given goes in the record ("p", 1-9) and in the due argument, "p<N>:<due>"
    // (protocol 1.1: the script indexes the task; 0 says none, and a replace without one
    // keeps a waiting task's).
    const priority = task.priority == null ? null : validatePriority(task.priority);
    const prefix = this.headerPrefix(task.kind, task.maxAttempts ?? 0, priority || 0);
    let data;
    try {
      data = JSON.stringify(task.payload === undefined ? null : task.payload);
    } catch (err) {
      throw new InvalidTaskError(`payload is not JSON-serialisable (${err.message})`);
    }
    if (data === undefined) throw new InvalidTaskError('payload is not JSON-serialisable');
    const size = data.length <= this.maxPayload / 3 ? data.length : Buffer.byteLength(data);
    if (size > this.maxPayload) {
      throw new InvalidTaskError(
        `payload is ${size} bytes encoded, over the queue's limit of ${this.maxPayload}; ` +
          'store large data elsewhere and pass a reference'
      );
    }
    const headers = task.headers == null ? '' : encodeHeaders(task.headers);
    const record = `${prefix}${createdMs}${headers}}\n${data}`;
    const due = dueSpec(task.delay, task.at);
    return { id, due: priority == null ? due : `p${priority}:${due}`, record };
  }

  /**
   * Schedule many tasks in a few round trips; every task is validated before any is sent.
   * Each task: {kind, payload, delay (s) | at (Date or Unix s), taskId, maxAttempts,
   * headers, priority (0-9, the higher claimed first among due tasks)}. Returns [{id, status, dueAt}] in the order given; status is 'created',
   * 'replaced', 'unchanged' or 'running' (see Queue.schedule in delayq's docs); dueAt, for a
   * task created or replaced, is the due time the script stored (the server's clock: what
   * get answers), else null.
   */
  async scheduleMany(tasks, { replace = false } = {}) {
    const createdMs = Date.now();
    const list = Array.from(tasks);
    const fresh = newTaskIds(list.length);
    const encodeAll = () => {
      const out = list.map((t, i) => this.encode(t, createdMs, fresh[i]));
      if (new Set(out.map((t) => t.id)).size !== out.length) {
        throw new InvalidTaskError('the same taskId appears twice in one scheduleMany call');
      }
      return out;
    };
    let encoded;
    if (this.writeChecked) {
      encoded = encodeAll();
    } else {
      // The first write: encoded with this client's settings (bad input is refused before
      // any call), then again if the queue's, read with the shard check, differ. A payload
      // over this client's limit reads the queue's first: the queue's setting decides.
      try {
        encoded = encodeAll();
      } catch (err) {
        if (!(err instanceof InvalidTaskError) || this.checked) throw err;
        try {
          await this.check(false);
        } catch (checkErr) {
          if (checkErr instanceof DelayqError) throw checkErr;
          throw err; // no server to ask: this client's refusal
        }
        encoded = encodeAll();
      }
      const read = this.settingsRead;
      await this.check(true);
      if (this.settingsRead !== read) encoded = encodeAll();
    }
    const ids = encoded.map((t) => t.id);
    const byShard = new Map();
    encoded.forEach((task, i) => {
      const shard = shardOf(task.id, this.n);
      if (!byShard.has(shard)) byShard.set(shard, []);
      byShard.get(shard).push(i);
    });
    const statuses = new Array(encoded.length);
    const dues = new Array(encoded.length).fill(null);
    const calls = [];
    for (const [shard, indexes] of byShard) {
      const tag = this.tag(shard);
      for (let start = 0; start < indexes.length; start += SCHEDULE_BATCH) {
        const chunk = indexes.slice(start, start + SCHEDULE_BATCH);
        const rest = [];
        for (const i of chunk) rest.push(encoded[i].id, encoded[i].due, encoded[i].record);
        const args = {
          now: '',
          dedupe_ms: this.dedupeMs,
          replace: replace ? '1' : '0',
          channel: this.key(tag, 'wake_channel'),
          durable: '0',
        };
        // Sent together: node-redis pipelines the calls of one tick.
        calls.push(
          this.call('schedule', tag, args, rest).then((reply) => {
            const now = reply[chunk.length]; // after the statuses: the now the call ran at
            chunk.forEach((i, j) => {
              const code = Number(reply[j]);
              statuses[i] = STATUS[code];
              if (code === 1 || code === 2) dues[i] = msToDate(storedDue(encoded[i].due, now));
            });
          })
        );
      }
    }
    await Promise.all(calls);
    return ids.map((id, i) => ({ id, status: statuses[i], dueAt: dues[i] }));
  }

  /** Schedule one task; options as one task of scheduleMany, plus replace. */
  async schedule(kind, payload, options = {}) {
    const { replace = false, ...rest } = options;
    const [result] = await this.scheduleMany([{ ...rest, kind, payload }], { replace });
    return result;
  }

  /**
   * Remove a waiting task; true if it was still waiting. It is remembered as cancelled for
   * the dedupe window (get answers state 'cancelled'); the id may be scheduled again at once.
   */
  async cancel(taskId) {
    validateTaskId(taskId);
    await this.check(false);
    const tag = this.tag(shardOf(taskId, this.n));
    const args = {
      id: taskId,
      now: '',
      dedupe_ms: this.dedupeMs,
      trim_limit: TRIM_LIMIT,
      finished: this.key(tag, 'finished_channel'),
    };
    return Number(await this.call('cancel', tag, args)) === 1;
  }

  /** Move a waiting task to a new due time ({delay} or {at}); true if it was waiting. */
  async reschedule(taskId, { delay, at } = {}) {
    validateTaskId(taskId);
    if (delay == null && at == null) throw new InvalidTaskError('reschedule needs delay or at');
    await this.check(false);
    const tag = this.tag(shardOf(taskId, this.n));
    const args = { now: '', channel: this.key(tag, 'wake_channel'), id: taskId, reply: '' };
    return Number(await this.call('reschedule', tag, { ...args, due: dueSpec(delay, at) })) === 1;
  }

  /**
   * A task as the queue holds it, or null for an unknown id. A done or aborted task answers
   * from its tombstone (protocol 1.1) unless its queue keeps whole records: its state,
   * finishedAt, attempts, kind and dueAt (its last run's, to the ms); payload null,
   * maxAttempts 0, createdAt null, headers {}. result: what a done task's handler returned
   * (null: nothing).
   */
  async get(taskId) {
    validateTaskId(taskId);
    await this.check(false);
    const reply = await this.call('get', this.tag(shardOf(taskId, this.n)), { id: taskId });
    if (!reply) return null;
    const [state, score, record, error, attempt, stored] = reply;
    const when = Number(score);
    let result = null;
    if (stored) {
      try {
        result = JSON.parse(stored);
      } catch {
        result = stored;
      }
    }
    if (state === 'cancelled') {
      // Only a tombstone is left: the id and when it was cancelled, as Python's get says.
      return {
        id: taskId,
        kind: '',
        payload: null,
        state,
        dueAt: null,
        attempts: 0,
        maxAttempts: 0,
        lastError: null,
        createdAt: null,
        leaseDeadline: null,
        finishedAt: msToDate(when),
        headers: {},
        result: null,
      };
    }
    const finishedAt =
      state === 'done' || state === 'dead' || state === 'aborted' ? msToDate(when) : null;
    const tomb = (state === 'done' || state === 'aborted') && /^(\d+) (-?\d*) (.*)$/s.exec(record);
    if (tomb) {
      return {
        id: taskId,
        kind: tomb[3],
        payload: null,
        state,
        dueAt: tomb[2] !== '' ? msToDate(when - Number(tomb[2])) : null,
        attempts: Number(tomb[1]),
        maxAttempts: 0,
        lastError: error || null,
        createdAt: null,
        leaseDeadline: null,
        finishedAt,
        headers: {},
        priority: 0,
        result,
      };
    }
    const nl = record.indexOf('\n');
    let header = null;
    try {
      header = nl >= 0 ? JSON.parse(record.slice(0, nl)) : null;
    } catch {
      header = null;
    }
    const [, tries, due] = attempt ? attempt.split(' ') : [0, 0, ''];
    let payload = null;
    let lastError = error || null;
    if (header && (header.f || 'json') === 'json') {
      try {
        payload = JSON.parse(record.slice(nl + 1));
      } catch (err) {
        lastError = lastError || `payload cannot be decoded as json: ${err.message}`;
      }
    }
    return {
      id: taskId,
      kind: header ? header.k : '?',
      payload,
      state,
      dueAt: state === 'scheduled' ? msToDate(when) : due ? msToDate(due) : null,
      attempts: Number(tries),
      maxAttempts: header ? header.m || 0 : 0,
      lastError,
      createdAt: header && header.c ? msToDate(header.c) : null,
      leaseDeadline: state === 'active' ? msToDate(when) : null,
      finishedAt,
      headers: header && header.h ? header.h : {},
      priority: header && Number.isInteger(header.p) && header.p >= 1 && header.p <= 9 ? header.p : 0,
      result,
    };
  }

  async close() {
    if (this.ownsClient && this.client.isOpen) await this.client.quit();
  }
}

module.exports = {
  Queue,
  DelayqError,
  ConfigurationError,
  InvalidTaskError,
  ProtocolVersionError,
  PROTOCOL_VERSION,
  shardOf,
  crc32,
};
