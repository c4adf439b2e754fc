// The client against real agents on a real PostgreSQL (run under
// tests/harness/with-postgres with PGCOORD_TEST_AGENT_BIN): every answer
// checked against the database too. Skipped without a cluster.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, PgcoordError, monoMs } from '../dist/index.js';
import { Agent, Database, haveFleet } from './fleet.mjs';

const skip = haveFleet() ? false : 'needs tests/harness/with-postgres and PGCOORD_TEST_AGENT_BIN';
const TIMINGS = ['--heartbeat-interval-ms', '200', '--session-ttl-ms', '1500', '--lease-retry-ms', '100',
  '--janitor-interval-ms', '200'];
let db, tmp, agentA, agentB;
const clients = [];

before(async () => {
  if (skip) return;
  tmp = mkdtempSync(path.join(process.env.PGCOORD_TEST_TMP || os.tmpdir(), 'node-it.'));
  db = await Database.create();
  agentA = await Agent.start(db, `node-a-${process.pid}`, tmp, TIMINGS);
  agentB = await Agent.start(db, `node-b-${process.pid}`, tmp, TIMINGS);
});

after(async () => {
  if (skip) return;
  for (const c of clients) c.close();
  await agentA?.stop();
  await agentB?.stop();
  await db?.close();
  rmSync(tmp, { recursive: true, force: true });
});

async function connect(agent, name) {
  const c = await Client.connect({ socketPath: agent.socketPath });
  clients.push(c);
  const s = await c.sessionOpen(name);
  return [c, s.session];
}

const rows = (sql) => db.psql(sql);

test('claim, deny, phase, uncertain, resolve: the database agrees at each step', { skip }, async () => {
  const [c, sid] = await connect(agentA, 'permits');
  const a = await c.claim('n1', { 'node-q': 1 }, { limit: 1, intent: 'job n1' });
  assert.equal(a.status, 'admitted');
  assert.equal(a.owner_session, sid);
  assert.deepEqual(await rows("SELECT state, owner_session::text FROM pgcoord.permits WHERE id = 'n1'"), [['held', String(sid)]]);
  assert.deepEqual(await rows("SELECT in_flight FROM pgcoord.quotas WHERE key = 'node-q'"), [['1']]);

  const d = await c.claim('n2', { 'node-q': 1 });
  assert.equal(d.status, 'denied');
  assert.equal(d.granted, false);
  assert.deepEqual([d.quota, d.limit, d.in_flight], ['node-q', 1, 1]);
  assert.deepEqual(await rows("SELECT count(*) FROM pgcoord.permits WHERE id = 'n2'"), [['0']]);

  assert.equal((await c.permitUpdate('n1', 'dispatched')).phase, 'dispatched');
  assert.equal((await c.markUncertain('n1', 'connector dropped')).state, 'uncertain');
  assert.deepEqual(await rows("SELECT state, phase FROM pgcoord.permits WHERE id = 'n1'"), [['uncertain', 'dispatched']]);
  await assert.rejects(c.release('n1'), (e) => e instanceof PgcoordError && e.code === 'conflict');
  const got = await c.permitGet('n1');
  assert.equal(Buffer.from(got.permit.intent).toString(), 'job n1');
  assert.equal((await c.permitResolve('n1', 'gone', 'the connector says it never started')).state, 'released');
  assert.deepEqual(await rows("SELECT in_flight FROM pgcoord.quotas WHERE key = 'node-q'"), [['0']]);
  const history = await c.permitHistory('n1');
  assert.deepEqual(history.events.map((e) => e.event), ['admitted', 'phase', 'uncertain', 'resolved_gone']);
  assert.equal((await c.permitCheck()).ok, true);
  assert.equal((await c.quotaGet('node-q')).quota.in_flight, 0);
});

test('a won lease: the belief is dated on the clock the agent shares', { skip }, async () => {
  const [c, sid] = await connect(agentA, 'lease');
  const before = monoMs();
  const r = await c.leaseAcquire('node-lease', { ttlMs: 3000 });
  const after = monoMs();
  assert.equal(r.leader, true);
  // valid_until_mono_ms is a reading of the agent's CLOCK_MONOTONIC: on
  // the same host it lies ahead of ours by at most the ttl.
  assert.ok(r.valid_until_mono_ms > after && r.valid_until_mono_ms <= before + 3000,
    `${before} < ${r.valid_until_mono_ms} <= ${before + 3000}`);
  const deadline = c.lease('node-lease').deadlineMs;
  assert.ok(deadline > after && deadline <= r.valid_until_mono_ms, `${after} < ${deadline} <= ${r.valid_until_mono_ms}`);
  assert.deepEqual(await rows("SELECT holder_session::text, epoch::text FROM pgcoord.leases WHERE name = 'node-lease'"),
    [[String(sid), String(r.epoch)]]);
  assert.equal(await c.leaseRelease('node-lease'), true);
  assert.equal(c.isLeader('node-lease'), false);
  assert.deepEqual(await rows("SELECT holder_session IS NULL FROM pgcoord.leases WHERE name = 'node-lease'"), [['t']]);
});

test("elect: a frozen agent's leader is told to stop before another wins", { skip }, async () => {
  const [c] = await connect(agentA, 'elect-a');
  const [d, sidB] = await connect(agentB, 'elect-b');
  const lead = await c.elect('node-elect', { ttlMs: 1500 });
  let abortedAt = 0;
  lead.signal.addEventListener('abort', () => (abortedAt = monoMs()));
  const changes = d.notifications();
  agentA.signal('SIGSTOP');
  try {
    const next = await d.elect('node-elect', { ttlMs: 1500 });
    const wonAt = monoMs();
    assert.ok(abortedAt > 0 && abortedAt <= wonAt, `aborted at ${abortedAt}, the other won at ${wonAt}`);
    assert.ok(next.epoch > lead.epoch);
    assert.deepEqual(await rows("SELECT holder_session::text, epoch::text FROM pgcoord.leases WHERE name = 'node-elect'"),
      [[String(sidB), String(next.epoch)]]);
    for await (const n of changes) {
      if (n.method === 'lease.changed' && n.params.leader === true) break;
    }
    assert.equal(await next.release(), true);
  } finally {
    agentA.signal('SIGCONT');
  }
  assert.equal(lead.lease.valid, false);
});

test("records: a new session recovers a closed session's work", { skip }, async () => {
  const [c] = await connect(agentA, 'records-old');
  await c.claim('rec-p', 'node-rec-q', { limit: 2 });
  const put = await c.recordPut('job', 'rec-1', 'dispatched', { data: 'payload', permit: 'rec-p' });
  assert.equal(put.created, true);
  await c.sessionClose();
  const [d, sid2] = await connect(agentA, 'records-new');
  const dry = await d.recordRecover({ kinds: ['job'], dryRun: true });
  assert.deepEqual(dry.adopted.map((r) => r.key), ['rec-1']);
  const rec = await d.recordRecover({ kinds: ['job'] });
  assert.equal(rec.liveness_read, true);
  assert.deepEqual(rec.adopted.map((r) => r.key), ['rec-1']);
  assert.deepEqual(await rows("SELECT owner_session::text FROM pgcoord.records WHERE kind = 'job' AND key = 'rec-1'"),
    [[String(sid2)]]);
  const settled = await d.recordSettle('job', 'rec-1', 'done');
  assert.equal(settled.record.terminal, true);
  assert.equal((await d.recordGet('job', 'rec-1')).record.state, 'done');
});
