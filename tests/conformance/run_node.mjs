#!/usr/bin/env node
// Runs the conformance scenarios (scenarios.json, format in README.md) with
// the Node client against real agents on a real database. Needs
// tests/harness/with-postgres around it, PGCOORD_TEST_AGENT_BIN, and the
// client built (client-lib/node: npm ci && npm run build).
//
//     run_node.mjs [--only NAME]... [scenarios.json]
//
// Exit status 0 when every vector and scenario passed, 1 otherwise.

import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeClient = path.join(here, '..', '..', 'client-lib', 'node');
const { Client, PgcoordError, monoMs } = await import(path.join(nodeClient, 'dist', 'index.js'));
const { Agent, Database, Proxy } = await import(path.join(nodeClient, 'test', 'fleet.mjs'));

class Failed extends Error {}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const AGENT_TIMINGS = ['--heartbeat-interval-ms', '200', '--session-ttl-ms', '1500', '--lease-retry-ms', '100',
  '--janitor-interval-ms', '200'];

/** ${name} in strings (whole string: the saved value itself). */
function substitute(value, saved) {
  if (typeof value === 'string') {
    const m = /^\$\{(\w+)\}$/.exec(value);
    if (m) return saved[m[1]];
    return value.replace(/\$\{(\w+)\}/g, (_, k) => String(saved[k]));
  }
  if (Array.isArray(value)) return value.map((v) => substitute(v, saved));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, saved)]));
  }
  return value;
}

const show = (v) => JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? `${x}n` : x));
const isMap = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array);

/** want is a subset of got; "$any", "$int", "$str", "$bool" match a type. */
function match(want, got, where) {
  if (want === '$any') return;
  if (want === '$int') {
    if (!Number.isInteger(got) && typeof got !== 'bigint') throw new Failed(`${where}: expected an integer, got ${show(got)}`);
    return;
  }
  if (want === '$str') {
    if (typeof got !== 'string') throw new Failed(`${where}: expected a string, got ${show(got)}`);
    return;
  }
  if (want === '$bool') {
    if (typeof got !== 'boolean') throw new Failed(`${where}: expected a bool, got ${show(got)}`);
    return;
  }
  if (isMap(want)) {
    if (!isMap(got)) throw new Failed(`${where}: expected a map, got ${show(got)}`);
    for (const [k, v] of Object.entries(want)) {
      if (k.startsWith('$')) continue;
      if (!(k in got)) throw new Failed(`${where}: no ${k} in ${show(got)}`);
      match(v, got[k], `${where}.${k}`);
    }
    return;
  }
  if (Array.isArray(want)) {
    if (!Array.isArray(got) || got.length !== want.length) throw new Failed(`${where}: expected ${show(want)}, got ${show(got)}`);
    want.forEach((w, i) => match(w, got[i], `${where}[${i}]`));
    return;
  }
  if (want !== got) throw new Failed(`${where}: expected ${show(want)}, got ${show(got)}`);
}

/** Runs fn; when the step names an error code, it must fail with it. */
async function expectError(step, fn) {
  const code = step.error;
  let out;
  try {
    out = await fn();
  } catch (e) {
    if (!(e instanceof PgcoordError)) throw e;
    if (code === undefined) throw new Failed(`${step.op ?? 'call'}: unexpected error ${e.message}`);
    if (e.code !== code) throw new Failed(`${step.op ?? 'call'}: expected error ${code}, got ${e.message}`);
    return e;
  }
  if (code !== undefined) throw new Failed(`${step.op ?? 'call'}: expected error ${code}, got ${show(out)}`);
  return out;
}

// A claim's result map as the scenarios see it: the client's own fields off.
function claimMap(c) {
  const { granted, attempts, earlier_outcome_unknown, ...raw } = c;
  return raw;
}

class Run {
  static async start(db, tmp, scenario) {
    const r = new Run();
    Object.assign(r, { db, tmp, agents: {}, proxies: {}, clients: {}, saved: {}, held: null, background: {},
      beliefEnded: new Map() });
    try {
      for (const name of scenario.agents ?? []) {
        const id = `${name}-${process.pid}-${readdirSync(tmp).length}`;
        r.agents[name] = await Agent.start(db, id, tmp, AGENT_TIMINGS);
      }
    } catch (e) {
      await r.close();
      throw e;
    }
    return r;
  }

  async close() {
    for (const c of Object.values(this.clients)) c.close();
    for (const p of Object.values(this.proxies)) await p.close();
    if (this.held) await this.held.release();
    for (const a of Object.values(this.agents)) await a.stop();
  }

  async step(s) {
    s = substitute(s, this.saved);
    const fn = this[`op_${s.op}`];
    if (!fn) throw new Failed(`unknown op ${s.op}`);
    await fn.call(this, s);
  }

  client(s) {
    return this.clients[s.client];
  }

  save(s, obj) {
    if (isMap(s.save)) for (const [v, field] of Object.entries(s.save)) this.saved[v] = obj[field];
  }

  async op_connect(s) {
    let p = this.agents[s.agent].socketPath;
    if (s.proxy) {
      const proxy = await Proxy.start(p, path.join(this.tmp, `proxy-${s.client}.sock`));
      this.proxies[s.client] = proxy;
      p = proxy.path;
    }
    this.clients[s.client] = await Client.connect({ socketPath: p, timeoutMs: 5000, retryMs: 10000 });
  }

  async op_open_session(s) {
    const r = await this.client(s).sessionOpen(s.name);
    if (typeof s.save === 'string') this.saved[s.save] = r.session;
  }

  async op_call(s) {
    const out = await expectError(s, () => this.client(s).call(s.method, s.params));
    if ('result' in s) match(s.result, out, s.method);
    this.save(s, out);
  }

  claimOf(s) {
    return this.client(s).claim(s.id, s.quotas, { limit: s.limit, timeoutMs: s.timeout_ms, retryMs: s.retry_ms });
  }

  async op_claim(s) {
    if (s.background) {
      const box = {};
      box.done = this.claimOf(s).then((v) => (box.out = v), (e) => (box.err = e));
      this.background[s.background] = box;
      return;
    }
    const out = await expectError(s, () => this.claimOf(s));
    if (out instanceof PgcoordError) return;
    if (s.expect) {
      match(s.expect, claimMap(out), 'claim');
      const least = s.expect.$attempts_at_least;
      if (least && out.attempts < least) throw new Failed(`claim: ${out.attempts} attempt(s), expected at least ${least}`);
    }
    this.save(s, out);
  }

  async op_await(s) {
    const box = this.background[s.name];
    const timeout = sleep(60000).then(() => 'timeout');
    if ((await Promise.race([box.done, timeout])) === 'timeout') throw new Failed(`${s.name} still running after 60 s`);
    if (box.err) {
      const e = box.err;
      if (s.error !== e.code) throw new Failed(`await ${s.name}: expected error ${s.error}, got ${e.message}`);
      if ('released' in s && s.released !== '$any' && e.released !== s.released) {
        throw new Failed(`await ${s.name}: released is ${e.released}`);
      }
    } else if (s.error) {
      throw new Failed(`await ${s.name}: expected error ${s.error}, got ${show(box.out)}`);
    }
  }

  async op_release(s) {
    const out = await expectError(s, () => this.client(s).release(s.id));
    if (s.expect && !(out instanceof PgcoordError)) match(s.expect, out, 'release');
  }

  async op_give_up(s) {
    await this.client(s).giveUp(s.id);
  }

  async op_lease_acquire(s) {
    const out = await expectError(s, () => this.client(s).leaseAcquire(s.name, { ttlMs: s.ttl_ms, wait: s.wait ?? false }));
    if (s.expect) match(s.expect, out, 'lease.acquire');
    this.save(s, out);
  }

  async op_lease_release(s) {
    const released = await this.client(s).leaseRelease(s.name);
    if (s.expect) match(s.expect, { released }, 'lease.release');
  }

  async op_expect_leader(s) {
    const c = this.client(s);
    const within = s.within_ms ?? 0;
    const end = monoMs() + within;
    while (c.isLeader(s.name) !== s.leader) {
      if (monoMs() >= end) throw new Failed(`${s.client}: isLeader(${s.name}) is not ${s.leader} after ${within} ms`);
      await sleep(5);
    }
    const now = monoMs();
    const key = `${s.client}\0${s.name}`;
    if (!s.leader && !this.beliefEnded.has(key)) this.beliefEnded.set(key, now);
    if (s.leader && s.deadline_within_ms !== undefined) {
      const left = c.beliefs.deadlineMs(s.name) - now;
      if (!(left > 0 && left <= s.deadline_within_ms)) {
        throw new Failed(`${s.client}: belief deadline ${left} ms ahead, expected within (0, ${s.deadline_within_ms}]`);
      }
    }
    if (s.leader && s.after_belief_of !== undefined) {
      const ended = this.beliefEnded.get(`${s.after_belief_of}\0${s.name}`);
      if (ended === undefined || ended > now) {
        throw new Failed(`${s.client} leads ${s.name} while ${s.after_belief_of} may still believe it does`);
      }
    }
  }

  async op_expect_session(s) {
    const c = this.client(s);
    if (!c.session || c.session.session !== s.session) {
      throw new Failed(`${s.client}: session is ${show(c.session)}, expected ${s.session}`);
    }
    if ('resumed' in s && c.session.resumed !== s.resumed) throw new Failed(`${s.client}: resumed is ${c.session.resumed}`);
  }

  async op_sql(s) {
    const rows = await this.db.psql(s.query);
    // psql answers text: compare expected values (saved ints too) as text
    const want = (s.rows ?? []).map((row) => row.map(String));
    if ('rows' in s && show(rows) !== show(want)) throw new Failed(`sql ${show(s.query)}: rows ${show(rows)}, expected ${show(s.rows)}`);
  }

  async op_list_all(s) {
    const r = await this.client(s).listAll(s.method, s.params ?? {}, s.page_size ? { pageSize: s.page_size } : {});
    const got = r.items.map((row) => String(row[s.key]));
    const want = (await this.db.psql(s.query)).map((row) => row[0]);
    if (show(got) !== show(want)) {
      throw new Failed(`list_all ${s.method}: ${got.length} rows ${show(got.slice(0, 5))}..., the database has ${want.length}: ${show(want.slice(0, 5))}...`);
    }
  }

  async op_sql_hold(s) {
    this.held = await this.db.hold(s.query);
  }

  async op_sql_release() {
    await this.held.release();
    this.held = null;
  }

  async op_signal(s) {
    this.agents[s.agent].signal(`SIG${s.signal}`);
  }

  async op_sleep(s) {
    await sleep(s.ms);
  }

  async op_proxy_drop_reply(s) {
    this.proxies[s.client].dropReply(s.method);
  }

  async op_proxy_cut(s) {
    this.proxies[s.client].cut();
  }
}

async function runVectors(db, tmp, vectors) {
  let failures = 0;
  const run = await Run.start(db, tmp, { agents: ['v'] });
  try {
    const c = await Client.connect({ socketPath: run.agents.v.socketPath });
    run.clients.v = c;
    for (const v of vectors) {
      try {
        const out = await expectError(v, () => c.call(v.call.method, v.call.params));
        if ('result' in v) match(v.result, out, v.call.method);
        console.log(`ok     vector: ${v.name}`);
      } catch (e) {
        if (!(e instanceof Failed)) throw e;
        failures++;
        console.log(`FAILED vector: ${v.name}: ${e.message}`);
      }
    }
  } finally {
    await run.close();
  }
  return failures;
}

async function runScenario(db, tmp, sc) {
  const started = monoMs();
  let run;
  try {
    run = await Run.start(db, tmp, sc);
    for (const [i, s] of sc.steps.entries()) {
      try {
        await run.step(s);
      } catch (e) {
        if (e instanceof Failed) throw new Failed(`step ${i + 1} (${s.op}): ${e.message}`);
        throw e;
      }
    }
    console.log(`ok     scenario: ${sc.name} (${((monoMs() - started) / 1000).toFixed(1)} s)`);
    return true;
  } catch (e) {
    console.log(`FAILED scenario: ${sc.name}: ${e instanceof Failed ? e.message : e.stack}`);
    for (const a of Object.values(run?.agents ?? {})) console.log(`--- log of agent ${a.replicaId} ---\n${a.logTail()}`);
    return false;
  } finally {
    await run?.close();
  }
}

async function main(argv) {
  const only = [];
  let file = path.join(here, 'scenarios.json');
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--only') only.push(argv[++i]);
    else file = argv[i];
  }
  const spec = JSON.parse(readFileSync(file, 'utf8'));
  if (spec.format !== 1) {
    console.log(`unknown scenario format ${show(spec.format)}`);
    return 1;
  }
  const tmp = mkdtempSync(path.join(process.env.PGCOORD_TEST_TMP || os.tmpdir(), 'node-conf.'));
  const db = await Database.create();
  let failures = 0;
  try {
    if (only.length === 0) failures += await runVectors(db, tmp, spec.vectors);
    for (const sc of spec.scenarios) {
      if (only.length && !only.includes(sc.name)) continue;
      if (!(await runScenario(db, tmp, sc))) failures++;
    }
  } finally {
    await db.close();
    rmSync(tmp, { recursive: true, force: true });
  }
  console.log(`${failures ? 'FAILED' : 'passed'}: ${failures} failure(s)`);
  return failures ? 1 : 0;
}

process.exit(await main(process.argv.slice(2)));
