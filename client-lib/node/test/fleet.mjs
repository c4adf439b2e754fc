// Real agents on a real database for the Node tests and the conformance
// runner (tests/conformance/run_node.mjs), as tests/conformance/fleet.py
// does for Python: a database in the cluster tests/harness/with-postgres
// started, migrated by the owner with --runtime-role, agents run as the
// runtime role, psql for asserting on database state, and a Unix-socket
// relay that can lose a reply or cut connections.

import { spawn, execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { openSync, closeSync, readFileSync } from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { decode, encode } from '@msgpack/msgpack';
import { Client, objectLength } from '../dist/index.js';

export function env(name) {
  const v = process.env[name];
  if (!v) {
    throw new Error(`${name} is not set: run under tests/harness/with-postgres with PGCOORD_TEST_AGENT_BIN pointing at pgcoord-agent`);
  }
  return v;
}

/** Whether the cluster and the agent binary are there (integration tests
 * skip without them). */
export function haveFleet() {
  return !!(process.env.PGCOORD_TEST_PGHOST && process.env.PGCOORD_TEST_AGENT_BIN);
}

function conninfo(dbname, user) {
  const bouncer = process.env.PGCOORD_TEST_PGBOUNCER_HOST;
  const host = bouncer || env('PGCOORD_TEST_PGHOST');
  const port = bouncer ? env('PGCOORD_TEST_PGBOUNCER_PORT') : env('PGCOORD_TEST_PGPORT');
  return `host='${host}' port='${port}' user='${user}' dbname='${dbname}'`;
}

function run(cmd, args, timeoutMs = 60000) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${path.basename(cmd)} failed: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let serial = 0;

function psqlArgs(db) {
  return ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', env('PGCOORD_TEST_PGHOST'), '-p', env('PGCOORD_TEST_PGPORT'),
    '-U', env('PGCOORD_TEST_PGUSER'), '-d', db];
}

/** A fresh database, migrated; dropped by close(). */
export class Database {
  static async create() {
    const db = new Database();
    db.name = `node_${process.pid}_${++serial}_${randomBytes(3).toString('hex')}`;
    await db.psql(`CREATE DATABASE "${db.name}"`, 'postgres');
    db.ownerConninfo = conninfo(db.name, env('PGCOORD_TEST_PGUSER'));
    db.agentConninfo = conninfo(db.name, env('PGCOORD_TEST_RUNTIME_ROLE'));
    await run(env('PGCOORD_TEST_AGENT_BIN'), ['migrate', '--database-url', db.ownerConninfo,
      '--runtime-role', env('PGCOORD_TEST_RUNTIME_ROLE')]);
    return db;
  }

  /** Rows of sql (run as the owner, straight to the server), as text. */
  async psql(sql, db) {
    const out = await run('psql', [...psqlArgs(db || this.name), '-A', '-t', '-F', '\t', '-c', sql]);
    return out.split('\n').filter((l) => l !== '').map((l) => l.split('\t'));
  }

  /** A transaction left open (say, holding a row lock) until release(). */
  async hold(sql) {
    const proc = spawn('psql', psqlArgs(this.name), { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stdin.write(`BEGIN;\n${sql};\n\\echo held\n`);
    await new Promise((resolve, reject) => {
      let seen = '';
      const onData = (d) => {
        seen += d;
        if (/^held$/m.test(seen)) {
          proc.stdout.off('data', onData);
          resolve();
        }
      };
      proc.stdout.on('data', onData);
      proc.stderr.on('data', (d) => (seen += d));
      proc.on('exit', () => reject(new Error(`could not hold ${sql}: ${seen}`)));
    });
    return {
      release: () =>
        new Promise((resolve) => {
          if (proc.exitCode !== null) return resolve();
          proc.on('exit', () => resolve());
          proc.stdin.end('ROLLBACK;\n');
        }),
    };
  }

  async close() {
    await this.psql(`DROP DATABASE IF EXISTS "${this.name}" WITH (FORCE)`, 'postgres');
  }
}

/** One pgcoord-agent process serving a socket of its own. */
export class Agent {
  static async start(db, replicaId, tmp, extra = []) {
    const a = new Agent();
    a.replicaId = replicaId;
    a.socketPath = path.join(tmp, `${replicaId}.sock`);
    a.logPath = path.join(tmp, `${replicaId}.log`);
    const log = openSync(a.logPath, 'a');
    a.proc = spawn(env('PGCOORD_TEST_AGENT_BIN'), ['--database-url', db.agentConninfo, '--replica-id', replicaId,
      '--socket-path', a.socketPath, ...extra], { stdio: ['ignore', log, log] });
    closeSync(log);
    a.exited = new Promise((resolve) => a.proc.on('exit', (code, sig) => resolve(code ?? sig)));
    await a.waitRegistered();
    return a;
  }

  async waitRegistered(timeoutMs = 20000) {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      if (this.proc.exitCode !== null) throw new Error(`agent ${this.replicaId} exited ${this.proc.exitCode}:\n${this.logTail()}`);
      try {
        const c = await Client.connect({ socketPath: this.socketPath, timeoutMs: 2000, reconnect: false });
        try {
          if ((await c.status()).registered === true) return;
        } finally {
          c.close();
        }
      } catch {
        // not up yet
      }
      await sleep(50);
    }
    throw new Error(`agent ${this.replicaId} not registered in time:\n${this.logTail()}`);
  }

  logTail(n = 30) {
    try {
      return readFileSync(this.logPath, 'utf8').split('\n').slice(-n).join('\n');
    } catch {
      return '';
    }
  }

  signal(sig) {
    this.proc.kill(sig);
  }

  async stop() {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill('SIGCONT');
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 10000);
    await this.exited;
    clearTimeout(t);
  }
}

/** Splits a byte stream into MessagePack objects (requests included). */
class Splitter {
  constructor() {
    this.buf = Buffer.alloc(0);
  }
  feed(chunk) {
    this.buf = Buffer.concat([this.buf, chunk]);
    const out = [];
    for (;;) {
      const n = this.buf.length ? objectLength(this.buf) : -1;
      if (n < 0) return out;
      out.push({ obj: decode(this.buf.subarray(0, n), { useBigInt64: true }), bytes: this.buf.subarray(0, n) });
      this.buf = this.buf.subarray(n);
    }
  }
}

/** Listens on a socket of its own and relays each connection to the agent.
 * dropReply(method) makes it swallow the reply to the next request of that
 * method and cut the connection (a reply lost on the way back); cut()
 * closes every connection it relays. */
export class Proxy {
  static async start(agentPath, proxyPath) {
    const p = new Proxy();
    p.path = proxyPath;
    p.pairs = new Set();
    p.dropMethod = null;
    p.dropped = 0;
    p.server = net.createServer((c) => p.relay(c, agentPath));
    await new Promise((resolve, reject) => {
      p.server.once('error', reject);
      p.server.listen(proxyPath, resolve);
    });
    return p;
  }

  relay(c, agentPath) {
    const a = net.createConnection({ path: agentPath });
    const pair = [c, a];
    this.pairs.add(pair);
    const up = new Splitter();
    const down = new Splitter();
    const doomed = new Set();
    const kill = () => {
      c.destroy();
      a.destroy();
      this.pairs.delete(pair);
    };
    c.on('error', kill).on('close', kill);
    a.on('error', kill).on('close', kill);
    c.on('data', (d) => {
      for (const { obj } of up.feed(d)) {
        if (this.dropMethod && obj[2] === this.dropMethod) {
          doomed.add(Number(obj[1]));
          this.dropMethod = null;
        }
      }
      a.write(d);
    });
    a.on('data', (d) => {
      for (const { obj, bytes } of down.feed(d)) {
        if (obj[0] === 1 && doomed.has(Number(obj[1]))) {
          // Lost on the way back: the client never sees it.
          this.dropped++;
          kill();
          return;
        }
        c.write(bytes);
      }
    });
  }

  dropReply(method) {
    this.dropMethod = method;
  }

  cut() {
    for (const [c, a] of [...this.pairs]) {
      c.destroy();
      a.destroy();
    }
    this.pairs.clear();
  }

  async close() {
    this.cut();
    await new Promise((resolve) => this.server.close(() => resolve()));
  }
}

export { encode, decode };
