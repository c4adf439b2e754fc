#!/usr/bin/env node
// Smoke test of client-lib/node/examples/scheduler against a real agent:
// permit-cycle's JSON, two replicas sharing per-tenant quotas with a
// connector that drops, and the recovery of a dead predecessor's records.
// Run under tests/harness/with-postgres with PGCOORD_TEST_AGENT_BIN.

import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeClient = path.join(here, '..', '..', 'client-lib', 'node');
const { Client } = await import(path.join(nodeClient, 'dist', 'index.js'));
const { Agent, Database } = await import(path.join(nodeClient, 'test', 'fleet.mjs'));
const EXAMPLE = path.join(nodeClient, 'examples', 'scheduler', 'scheduler.mjs');

function scheduler(sock, ...args) {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [EXAMPLE, '--socket', sock, ...args], { timeout: 60000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`scheduler ${args[0]} failed (${err.code}): ${stderr}${stdout}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

// A replica left running (--stay): its stderr as it comes, its JSON at exit.
function replica(sock, ...args) {
  const p = spawn(process.execPath, [EXAMPLE, '--socket', sock, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const r = { stdout: '', stderr: '', exited: false };
  p.stdout.on('data', (d) => (r.stdout += d));
  p.stderr.on('data', (d) => (r.stderr += d));
  r.done = new Promise((resolve, reject) => {
    p.on('error', reject);
    p.on('close', (code) => {
      r.exited = true;
      if (code !== 0) reject(new Error(`scheduler ${args[0]} failed (${code}): ${r.stderr}${r.stdout}`));
      else resolve(JSON.parse(r.stdout));
    });
  });
  r.done.catch(() => {}); // awaited later; a failure is reported there
  r.stop = () => {
    p.kill('SIGTERM');
    return r.done;
  };
  return r;
}

// Waits for cond() to hold, for at most boundMs: a bound on a hang, not a
// guess at how long anything takes.
async function waitUntil(cond, what, boundMs = 30000) {
  const end = Date.now() + boundMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`FAILED ${what}: still not so after ${boundMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function check(cond, what) {
  if (!cond) throw new Error(`FAILED ${what}`);
  console.log(`ok     ${what}`);
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function main() {
  const tmp = mkdtempSync(path.join(process.env.PGCOORD_TEST_TMP || os.tmpdir(), 'node-sched.'));
  const db = await Database.create();
  let agent;
  try {
    // No grace: a client that goes away leaves a dead session at once.
    agent = await Agent.start(db, `node-sched-${process.pid}`, tmp,
      ['--session-grace-ms', '0', '--heartbeat-interval-ms', '200', '--lease-retry-ms', '100']);
    const out = await scheduler(agent.socketPath, 'permit-cycle', '--id', 'npc-1');
    check(out.claim.status === 'admitted' && out.claim.id === 'npc-1' &&
      same(out.release, { released: true, state: 'released' }) &&
      same(out.quota, { key: 'permit-cycle', limit: 1, in_flight: 0 }),
      `permit-cycle prints the claim and the release: ${JSON.stringify(out)}`);
    check(same(await db.psql("SELECT state FROM pgcoord.permits WHERE id = 'npc-1'"), [['released']]),
      "permit-cycle's permit is released in the database");

    // A predecessor that died mid-job: a record and its held permit.
    const dead = await Client.connect({ socketPath: agent.socketPath });
    const old = (await dead.sessionOpen('scheduler old')).session;
    await dead.claim('old-job', { 'tenant-0': 1 }, { limit: 2 });
    await dead.recordPut('scheduler.job', 'old-job', 'dispatching', { permit: 'old-job' });
    dead.close();
    // Another that dies only once the successors are at work.
    const lateC = await Client.connect({ socketPath: agent.socketPath });
    const late = (await lateC.sessionOpen('scheduler late')).session;
    await lateC.claim('late-job', { 'tenant-1': 1 }, { limit: 2 });
    await lateC.recordPut('scheduler.job', 'late-job', 'dispatching', { permit: 'late-job' });

    // The successors start at once: the first dead session may still be
    // live when they boot (the agent ends it at its next heartbeat), so they
    // must take a record when its owner dies, not only at boot.
    const a = replica(agent.socketPath, 'run', '--replica', 'r1', '--jobs', '20', '--drop-every', '5', '--stay');
    const b = replica(agent.socketPath, 'run', '--replica', 'r2', '--jobs', '20', '--drop-every', '5', '--stay');
    // Each recovers at boot before its first job: once both have put one,
    // the late predecessor dies after every boot recovery.
    await waitUntil(async () => same(await db.psql(
      "SELECT count(DISTINCT split_part(key, '-', 1)) FROM pgcoord.records WHERE key ~ '^r[12]-job-'"), [['2']]),
    'both replicas at work');
    lateC.close();
    const adopted = `SELECT r.key, r.state, r.adopted_from, s.name FROM pgcoord.records r
      JOIN pgcoord.sessions s ON s.id = r.owner_session
      WHERE r.kind = 'scheduler.job' AND r.key IN ('old-job', 'late-job') AND r.terminal ORDER BY r.key DESC`;
    await waitUntil(async () => (await db.psql(adopted)).length === 2, 'both dead records settled by successors');
    for (const r of [a, b]) {
      await waitUntil(() => r.stderr.includes('following the records') || r.exited, 'the replicas dispatched their jobs', 60000);
    }
    const [ra, rb] = await Promise.all([a.stop(), b.stop()]);
    const got = await db.psql(adopted);
    const successor = (name) => name === 'scheduler r1' || name === 'scheduler r2';
    check(got.length === 2 &&
      same(got[0].slice(0, 3), ['old-job', 'abandoned', String(old)]) && successor(got[0][3]) &&
      same(got[1].slice(0, 3), ['late-job', 'abandoned', String(late)]) && successor(got[1][3]),
    `successors adopted both dead predecessors' records and settled them: ${JSON.stringify(got)}`);
    check(same([...ra.recovered, ...rb.recovered].sort(), ['late-job', 'old-job']) &&
      same(await db.psql("SELECT key, count(*) FROM pgcoord.record_events WHERE event = 'adopt' GROUP BY key ORDER BY key"),
        [['late-job', '1'], ['old-job', '1']]),
    "a replica recovered its dead predecessor's record: each exactly once, nothing else adopted, also one " +
      `whose owner died after the replicas booted (r1 ${ra.recovered}, r2 ${rb.recovered})`);
    check(same(await db.psql(`SELECT count(*) FROM pgcoord.sessions WHERE id IN (${old}, ${late}) AND closed_at IS NOT NULL`),
      [['2']]), "the dead predecessors' sessions are closed");
    check(ra.completed.length + rb.completed.length > 0 && ra.uncertain.length + rb.uncertain.length > 0,
      `jobs completed (${ra.completed.length}+${rb.completed.length}) and dropped dispatches were marked ` +
      `uncertain (${ra.uncertain.length}+${rb.uncertain.length})`);
    const reconciled = new Set([...ra.reconciled, ...rb.reconciled]);
    check([...ra.uncertain, ...rb.uncertain].every((j) => reconciled.has(j)),
      `the leader reconciled every uncertain permit (${reconciled.size})`);
    check(same(await db.psql("SELECT count(*) FROM pgcoord.permits WHERE state <> 'released'"), [['0']]) &&
      same(await db.psql('SELECT coalesce(sum(in_flight), 0) FROM pgcoord.quotas'), [['0']]),
      'every permit ended released and nothing stays in flight');
    check(same(await db.psql('SELECT count(*) FROM pgcoord.records WHERE settled_at IS NULL'), [['0']]),
      'every record is settled');
    // The quota held at every admission: the audit never shows more
    // admitted than the limit at once for any tenant.
    const over = await db.psql(`
      SELECT key FROM (
        SELECT key, sum(delta) OVER (PARTITION BY key ORDER BY id) AS running
        FROM pgcoord.permit_events WHERE key LIKE 'tenant-%') s
      WHERE running > 2 LIMIT 1`);
    check(over.length === 0, 'no tenant ever had more than its limit in flight');
    const c = await Client.connect({ socketPath: agent.socketPath });
    try {
      check((await c.permitCheck()).ok === true, 'permit.check finds conservation intact');
      const { agents } = await c.fleetAgents();
      check(agents.some((a) => a.live && a.replica_id === agent.replicaId), 'fleetAgents lists the agent, live');
      const events = (await c.permitHistory('npc-1')).events.map((e) => e.event);
      check(same(events, ['admitted', 'released']), `permitHistory of permit-cycle's id: ${events}`);
    } finally {
      c.close();
    }
  } finally {
    await agent?.stop();
    await db.close();
    rmSync(tmp, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.log(e.message.startsWith('FAILED') ? e.message : `FAILED ${e.stack}`);
    process.exit(1);
  },
);
