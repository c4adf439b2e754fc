#!/usr/bin/env node
// Smoke test of client-lib/node/examples/scheduler against a real agent:
// permit-cycle's JSON, two replicas sharing per-tenant quotas with a
// connector that drops, and the recovery of a dead predecessor's records.
// Run under tests/harness/with-postgres with PGCOORD_TEST_AGENT_BIN.

import { execFile } from 'node:child_process';
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
    await dead.sessionOpen('scheduler old');
    await dead.claim('old-job', { 'tenant-0': 1 }, { limit: 2 });
    await dead.recordPut('scheduler.job', 'old-job', 'dispatching', { permit: 'old-job' });
    dead.close();

    const [ra, rb] = await Promise.all([
      scheduler(agent.socketPath, 'run', '--replica', 'r1', '--jobs', '20', '--drop-every', '5'),
      scheduler(agent.socketPath, 'run', '--replica', 'r2', '--jobs', '20', '--drop-every', '5'),
    ]);
    check([...ra.recovered, ...rb.recovered].includes('old-job'), "a replica recovered its dead predecessor's record");
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
