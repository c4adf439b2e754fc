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
const WATCH_POLL_MS = 100;
const TIMINGS = ['--heartbeat-interval-ms', '200', '--session-ttl-ms', '1500', '--lease-retry-ms', '100',
  '--janitor-interval-ms', '200', '--watch-poll-ms', String(WATCH_POLL_MS), '--wait-poll-ms', '50'];
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

async function connect(agent, name, opts = {}) {
  const c = await Client.connect({ socketPath: agent.socketPath, ...opts });
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

/** Every notification c receives from now on, with when it was read. */
function record(c) {
  const seen = [];
  c.on('notification', (method, params) => seen.push({ method, params, at: monoMs() }));
  return seen;
}

/** The first notification in seen of method that pred accepts, within ms. */
async function waitFor(seen, method, pred, ms) {
  const end = monoMs() + ms;
  for (;;) {
    const n = seen.find((m) => m.method === method && pred(m.params));
    if (n) return n;
    if (monoMs() > end) assert.fail(`no ${method} within ${ms} ms`);
    await sleep(5);
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('keepalive: kept, the session and its lease live on; stopped, session.lost and no more renewals', { skip }, async () => {
  const [c, sid] = await connect(agentA, 'keepalive', { keepaliveMs: 800 });
  assert.equal(c.session.keepalive_ms, 800);
  const lease = await c.leaseAcquire('node-keepalive', { ttlMs: 1500 });
  assert.equal(lease.leader, true);
  const seen = record(c);
  let lastSentAt = 0;
  for (let i = 0; i < 8; i++) { // 1.2 s: past keepalive_ms, with room for a busy machine
    lastSentAt = monoMs();
    const k = await c.keepalive();
    assert.ok(k.live && k.keepalive_ms === 800 && k.next_due_ms > 0 && k.next_due_ms <= 800, JSON.stringify(k));
    await sleep(150);
  }
  assert.equal(c.isLeader('node-keepalive'), true);
  const live = `SELECT count(*) FROM pgcoord.live_sessions WHERE id = ${sid}`;
  assert.deepEqual(await rows(live), [['1']]);
  assert.deepEqual(await rows("SELECT holder_session::text FROM pgcoord.leases WHERE name = 'node-keepalive'"), [[String(sid)]]);

  // the application stops calling: the agent notices by itself
  const lost = await waitFor(seen, 'session.lost', (p) => p.session === sid, 3000);
  assert.equal(lost.params.reason, 'keepalive missed');
  // the agent's clock restarted when the last keepalive arrived, after it was sent
  assert.ok(lost.at - lastSentAt >= 795, `lost ${lost.at - lastSentAt} ms after the last keepalive`);
  assert.equal(c.isLeader('node-keepalive'), false);
  await assert.rejects(c.keepalive(), (e) => e instanceof PgcoordError && e.code === 'session_expired');
  await assert.rejects(c.call('session.keepalive'), (e) => e instanceof PgcoordError && e.code === 'session_expired');
  // no longer renewed: the row expires within session_ttl_ms (1.5 s)
  const deadline = monoMs() + 5000;
  while ((await rows(live))[0][0] !== '0') {
    assert.ok(monoMs() < deadline, 'the lost session is still renewed');
    await sleep(100);
  }
  // a value out of the agent's range is its invalid_params
  const bad = await Client.connect({ socketPath: agentA.socketPath, keepaliveMs: 50 });
  clients.push(bad);
  await assert.rejects(bad.sessionOpen('bad'), (e) => e instanceof PgcoordError && e.code === 'invalid_params');
});

test("watch: a quota watcher hears another session's release within the poll interval", { skip }, async (t) => {
  const [w] = await connect(agentA, 'watcher');
  const [o, osid] = await connect(agentB, 'worker');
  await o.claim('node-w1', { 'node-wq': 1 }, { limit: 2 });
  await o.recordPut('node-wjob', 'w-1', 'running', { permit: 'node-w1' });
  const seen = record(w);
  const qw = await w.quotaWatch('node-wq');
  assert.equal(qw.poll_ms, WATCH_POLL_MS);
  const { params: first } = await waitFor(seen, 'quota.changed', (p) => p.watch === qw.watch, 2000);
  assert.deepEqual([first.key, first.exists, first.limit, first.in_flight, first.room], ['node-wq', true, 2, 1, 1]);
  const pw = await w.permitWatch('node-w1');
  assert.equal((await waitFor(seen, 'permit.changed', (p) => p.watch === pw.watch, 2000)).params.state, 'held');

  const releasedAt = monoMs();
  assert.equal((await o.release('node-w1')).released, true);
  const heard = await waitFor(seen, 'quota.changed', (p) => p.watch === qw.watch && p.in_flight === 0, 2000);
  const after = heard.params;
  const tookMs = heard.at - releasedAt;
  t.diagnostic(`the release was heard after ${Math.round(tookMs)} ms (watch_poll_ms ${WATCH_POLL_MS})`);
  // one poll, plus scheduling slack on a machine busy with other suites
  assert.ok(tookMs <= WATCH_POLL_MS + 600, `heard after ${tookMs} ms`);
  assert.deepEqual([after.in_flight, after.room, after.permits], [0, 2, 0]);
  assert.deepEqual(await rows("SELECT in_flight, \"limit\" FROM pgcoord.quotas WHERE key = 'node-wq'"), [['0', '2']]);
  await waitFor(seen, 'permit.changed', (p) => p.watch === pw.watch && p.state === 'released', 2000);

  // a record whose owner session ends is pushed as orphaned
  const rw = await w.recordWatch('node-wjob');
  await o.sessionClose();
  const { params: orphan } = await waitFor(seen, 'record.orphaned', (p) => p.watch === rw.watch, 3000);
  assert.deepEqual([orphan.kind, orphan.key, orphan.owner_session], ['node-wjob', 'w-1', osid]);
  assert.deepEqual(await rows("SELECT closed_at IS NOT NULL FROM pgcoord.sessions WHERE id = " + osid), [['t']]);

  assert.equal(await w.watchCancel(qw.watch), true);
  assert.equal(await w.watchCancel(qw.watch), false);
});

test('claimWait: queued on one agent, admitted when another frees the slot; expired; aborted', { skip }, async () => {
  const [holder] = await connect(agentA, 'wait-holder');
  const [waiter, sid] = await connect(agentB, 'wait-waiter');
  const queued = async (id) => (await rows(`SELECT count(*) FROM pgcoord.waiters WHERE id = '${id}' AND state = 'queued'`))[0][0];
  assert.equal((await holder.claim('nw-holder', { 'node-wq': 1 }, { limit: 1 })).status, 'admitted');

  const heard = [];
  waiter.on('permit.admitted', (p) => heard.push(p.id));
  const wait = waiter.claimWait('nw-1', { 'node-wq': 1 }, { waitMs: 20000 });
  while ((await queued('nw-1')) !== '1') await new Promise((r) => setTimeout(r, 20));
  const second = await holder.claim('nw-2', { 'node-wq': 1 }, { waitMs: 20000 });
  assert.equal(second.status, 'queued');
  assert.equal(second.position, 2);
  assert.ok(second.deadline_at > second.queued_at);
  const cancelled = await holder.permitCancel('nw-2');
  assert.deepEqual([cancelled.cancelled, cancelled.status], [true, 'cancelled']);
  await holder.release('nw-holder');
  const r = await wait;
  assert.equal(r.status, 'admitted');
  assert.equal(r.owner_session, sid);
  assert.ok(r.token > 0 && r.queued_ms >= 0);
  assert.deepEqual(heard, ['nw-1']);
  assert.deepEqual(await rows("SELECT state, owner_session::text FROM pgcoord.permits WHERE id = 'nw-1'"), [['held', String(sid)]]);

  await assert.rejects(waiter.claimWait('nw-3', { 'node-wq': 1 }, { waitMs: 200 }), (e) => e.code === 'expired');
  assert.deepEqual(await rows("SELECT count(*) FROM pgcoord.permits WHERE id = 'nw-3'"), [['0']]);
  assert.equal(await queued('nw-3'), '0');

  const given = holder.claimWait('nw-4', { 'node-wq': 1 }, { waitMs: 20000, signal: AbortSignal.timeout(300) });
  await assert.rejects(given, (e) => e.code === 'aborted');
  assert.equal(await queued('nw-4'), '0');
  await waiter.release('nw-1');
  assert.deepEqual(await rows("SELECT in_flight FROM pgcoord.quotas WHERE key = 'node-wq'"), [['0']]);
  assert.deepEqual(await rows("SELECT count(*) FROM pgcoord.permits WHERE id = 'nw-4'"), [['0']]);
  assert.equal((await holder.permitCheck()).ok, true);
});
