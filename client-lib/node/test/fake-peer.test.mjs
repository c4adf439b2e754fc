// The client against a fake agent on a real Unix socket: replies in any
// order, garbage, a peer that closes or never answers, bad arguments,
// notifications, same-id retries and resume. Every failure must be an
// ordinary rejected Promise, never a hang.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { decode, encode } from '@msgpack/msgpack';
import { Client, GaveUpError, PgcoordError, monoMs, objectLength } from '../dist/index.js';

const tmp = mkdtempSync(path.join(process.env.PGCOORD_TEST_TMP || os.tmpdir(), 'node-fake.'));
after(() => rmSync(tmp, { recursive: true, force: true }));
let serial = 0;

/** A fake agent: handle(request, conn) answers each request (a result map,
 * an error map as {error}, or nothing); conn.sock is the raw socket. */
async function fakeAgent(handle) {
  const sockPath = path.join(tmp, `fake-${++serial}.sock`);
  const conns = [];
  const server = net.createServer((sock) => {
    const conn = { sock, index: conns.length, requests: [] };
    conns.push(conn);
    let buf = Buffer.alloc(0);
    sock.on('error', () => {});
    sock.on('data', async (d) => {
      buf = Buffer.concat([buf, d]);
      for (let n; buf.length && (n = objectLength(buf)) > 0; buf = buf.subarray(n)) {
        const [, msgid, method, params] = decode(buf.subarray(0, n));
        const req = { msgid, method, params: params[0] ?? {} };
        conn.requests.push(req);
        const out = await handle(req, conn);
        if (out === undefined || sock.destroyed) continue;
        sock.write(encode(out.error ? [1, msgid, out.error, null] : [1, msgid, null, out]));
      }
    });
  });
  await new Promise((r) => server.listen(sockPath, r));
  return {
    path: sockPath,
    conns,
    close: () => {
      for (const c of conns) c.sock.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

async function withFake(handle, fn, opts = {}) {
  const fake = await fakeAgent(handle);
  const client = await Client.connect({ socketPath: fake.path, timeoutMs: 1000, ...opts });
  try {
    await fn(client, fake);
  } finally {
    client.close();
    await fake.close();
  }
}

const rejectsWith = (p, code) => assert.rejects(p, (e) => e instanceof PgcoordError && e.code === code);

test('replies are matched to calls by msgid, in any order', async () => {
  const held = [];
  await withFake(
    (req, conn) => {
      if (req.method === 'slow') {
        held.push(req);
        return undefined;
      }
      // answer the slow call after the fast one
      setTimeout(() => conn.sock.write(encode([1, held[0].msgid, null, { which: 'slow' }])), 20);
      return { which: 'fast' };
    },
    async (c) => {
      const slow = c.call('slow');
      const fast = c.call('fast');
      assert.deepEqual(await fast, { which: 'fast' });
      assert.deepEqual(await slow, { which: 'slow' });
    },
  );
});

test("the agent's error answers reject with its code; unknown methods too", async () => {
  await withFake(
    () => ({ error: { code: 'method_not_found', message: 'no method agent.nope', retryable: false } }),
    async (c) => {
      await rejectsWith(c.call('agent.nope'), 'method_not_found');
      // the connection still serves
      await rejectsWith(c.call('agent.nope'), 'method_not_found');
    },
  );
});

test('garbage from the agent rejects the calls in flight, and the next call reconnects', async () => {
  await withFake(
    (req, conn) => {
      if (conn.index === 0) {
        conn.sock.write(Buffer.from([0xc1, 0xc1, 0xc1]));
        return undefined;
      }
      return { pong: true };
    },
    async (c, fake) => {
      await rejectsWith(c.call('agent.ping'), 'protocol');
      assert.equal(await c.ping(), true);
      assert.equal(fake.conns.length, 2);
    },
  );
});

test('a well-formed message of the wrong shape is a protocol error', async () => {
  await withFake(
    (req, conn) => {
      conn.sock.write(encode({ not: 'an array' }));
    },
    async (c) => {
      await rejectsWith(c.call('agent.ping'), 'protocol');
    },
    { reconnect: false },
  );
});

test('a peer that closes mid-call: connection_lost (outcome unknown); one that closes mid-message says so', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'half') conn.sock.end(encode([1, req.msgid, null, { a: 'x'.repeat(100) }]).subarray(0, 20));
      else conn.sock.end();
    },
    async (c) => {
      const e = await c.call('agent.ping').catch((x) => x);
      assert.equal(e.code, 'connection_lost');
      assert.equal(e.outcomeUnknown, true);
      const e2 = await c.call('half').catch((x) => x);
      assert.equal(e2.code, 'connection_lost');
      assert.match(e2.message, /middle of a message/);
    },
  );
});

test('no reply in time: call_timeout; a late reply is dropped', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'never') {
        setTimeout(() => conn.sock.write(encode([1, req.msgid, null, { late: true }])), 150);
        return undefined;
      }
      return { pong: true };
    },
    async (c) => {
      const t0 = monoMs();
      await rejectsWith(c.call('never', undefined, { timeoutMs: 100 }), 'call_timeout');
      assert.ok(monoMs() - t0 < 1000);
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(await c.ping(), true);
    },
  );
});

test('an AbortSignal ends the wait with code aborted', async () => {
  await withFake(
    () => undefined,
    async (c) => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error('enough')), 30);
      await rejectsWith(c.call('never', undefined, { signal: ac.signal }), 'aborted');
      await rejectsWith(c.call('never', undefined, { signal: AbortSignal.abort() }), 'aborted');
      await rejectsWith(c.leaseAcquire('x', { signal: AbortSignal.abort() }), 'aborted');
    },
  );
});

test('wrong argument types are refused before anything is sent', async () => {
  await withFake(
    () => ({ ok: true }),
    async (c, fake) => {
      await rejectsWith(c.call(42), 'bad_argument');
      await rejectsWith(c.call(''), 'bad_argument');
      await rejectsWith(c.call('x', 'params'), 'bad_argument');
      await rejectsWith(c.call('x', [1]), 'bad_argument');
      await rejectsWith(c.claim(7, { q: 1 }), 'bad_argument');
      await rejectsWith(c.claim('id', 5), 'bad_argument');
      await rejectsWith(c.claim('id', { q: 'one' }), 'bad_argument');
      await rejectsWith(c.leaseAcquire(''), 'bad_argument');
      await rejectsWith(c.release(null), 'bad_argument');
      assert.equal(fake.conns[0].requests.length, 0);
    },
  );
});

test('a missing socket rejects with connect; a closed client with closed', async () => {
  await rejectsWith(Client.connect({ socketPath: path.join(tmp, 'nobody.sock') }), 'connect');
  await withFake(
    () => ({ pong: true }),
    async (c) => {
      c.close();
      await rejectsWith(c.ping(), 'closed');
    },
  );
});

test('msgid 0 with an error: the agent refused the stream', async () => {
  await withFake(
    (req, conn) => {
      conn.sock.write(encode([1, 0, { code: 'too_large', message: 'message over 1048576 bytes', retryable: false }, null]));
    },
    async (c) => {
      await rejectsWith(c.call('agent.ping'), 'too_large');
    },
    { reconnect: false },
  );
});

test('notifications: events, the async iterator, and a listener that throws', async () => {
  await withFake(
    (req, conn) => {
      conn.sock.write(encode([2, 'agent.db_down', []]));
      conn.sock.write(encode([2, 'lease.changed', [{ name: 'x', leader: false, epoch: 2 }]]));
      return { pong: true };
    },
    async (c) => {
      const seen = [];
      c.on('notification', () => {
        throw new Error('a buggy listener');
      });
      c.on('lease.changed', (p) => seen.push(p.name));
      const ac = new AbortController();
      const it = c.notifications({ signal: ac.signal });
      await c.ping();
      const first = await it.next();
      const second = await it.next();
      assert.deepEqual([first.value.method, second.value.method], ['agent.db_down', 'lease.changed']);
      assert.deepEqual(seen, ['x']);
      ac.abort();
      assert.equal((await it.next()).done, true);
      // for-await ends when the client closes
      const it2 = c.notifications();
      setTimeout(() => c.close(), 20);
      for await (const n of it2) assert.fail(`unexpected ${n.method}`);
    },
  );
});

test('claim retries retryable errors with the same id', async () => {
  await withFake(
    (req, conn) => {
      if (req.method !== 'permit.claim') return {};
      if (conn.requests.length < 3) return { error: { code: 'unavailable', message: 'db down', retryable: true } };
      return { status: 'admitted', id: req.params.id, mine: true, token: 5 };
    },
    async (c, fake) => {
      const r = await c.claim('j1', { tenant: 2 }, { limit: 4 });
      assert.equal(r.status, 'admitted');
      assert.equal(r.granted, true);
      assert.equal(r.attempts, 3);
      assert.equal(r.earlier_outcome_unknown, false);
      const sent = fake.conns[0].requests.map((q) => q.params);
      assert.deepEqual(sent, Array(3).fill({ id: 'j1', quotas: [{ key: 'tenant', weight: 2 }], limit: 4 }));
    },
  );
});

test('a claim that never gets an answer gives up and releases the id', async () => {
  await withFake(
    (req) => {
      if (req.method === 'permit.release') {
        return { error: { code: 'not_found', message: 'no permit j2; the id is retired', retryable: false } };
      }
      return undefined;
    },
    async (c, fake) => {
      const e = await c.claim('j2', 'tenant', { timeoutMs: 50, retryMs: 200 }).catch((x) => x);
      assert.ok(e instanceof GaveUpError, String(e));
      assert.equal(e.code, 'gave_up');
      assert.equal(e.released, true);
      assert.equal(e.last.code, 'call_timeout');
      const methods = fake.conns[0].requests.map((q) => q.method);
      assert.ok(methods.filter((m) => m === 'permit.claim').length >= 2, methods.join());
      assert.equal(methods.at(-1), 'permit.release');
      assert.equal(fake.conns[0].requests.at(-1).params.id, 'j2');
    },
  );
});

test('the lease belief is dated before the reply was read and capped by valid_until_mono_ms', async () => {
  let cap = 0;
  await withFake(
    (req) => ({ name: req.params.name, leader: true, epoch: 4, valid_ms: 800, valid_until_mono_ms: cap, campaigning: false, ttl_ms: 3000 }),
    async (c) => {
      const before = monoMs();
      await c.leaseAcquire('a');
      const after = monoMs();
      const d = c.beliefs.deadlineMs('a');
      assert.ok(d <= after + 800 && d >= before + 800 - 200, `${before} ${d} ${after}`);
      assert.equal(c.isLeader('a'), true);
      const lease = c.lease('a');
      assert.equal(lease.valid, true);
      assert.equal(lease.epoch, 4);
      cap = monoMs() + 100;
      await c.leaseAcquire('b');
      assert.equal(c.beliefs.deadlineMs('b'), cap);
      await new Promise((r) => setTimeout(r, 150));
      assert.equal(c.isLeader('b'), false, 'ended on the clock, no message needed');
      assert.equal(c.isLeader('a'), true);
    },
  );
});

test('elect: the signal is aborted when the belief runs out', async () => {
  await withFake(
    (req) => {
      if (req.method === 'lease.release') return { released: true };
      return { name: req.params.name, leader: true, epoch: 9, valid_ms: 120, valid_until_mono_ms: 0, campaigning: false, ttl_ms: 1000 };
    },
    async (c) => {
      const lead = await c.elect('e');
      assert.equal(lead.signal.aborted, false);
      assert.equal(lead.lease.valid, true);
      const deadline = lead.lease.deadlineMs;
      await new Promise((resolve) => lead.signal.addEventListener('abort', resolve));
      assert.ok(monoMs() >= deadline, 'aborted at the deadline, not before');
      assert.ok(monoMs() < deadline + 100, 'and promptly');
      assert.equal(lead.signal.reason.code, 'lease_lost');
      assert.equal(lead.lease.valid, false);
      assert.equal(await lead.release(), true);
    },
  );
});

test('a lost connection resumes the session on the next call', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'session.open') {
        return { session: 77, resumed: req.params.resume === 77, ttl_ms: 1500, grace_ms: 5000 };
      }
      if (conn.index === 0) {
        conn.sock.destroy();
        return undefined;
      }
      return { session: 77, live: true, last_heartbeat_ms_ago: 3 };
    },
    async (c, fake) => {
      await c.sessionOpen('fake');
      const events = [];
      c.on('notification', (m) => events.push(m));
      await rejectsWith(c.keepalive(), 'connection_lost');
      const k = await c.keepalive();
      assert.equal(k.live, true);
      assert.equal(c.session.resumed, true);
      assert.deepEqual(fake.conns[1].requests[0], { msgid: 1, method: 'session.open', params: { resume: 77 } });
      assert.deepEqual(events, ['connection.lost', 'session.resumed']);
    },
  );
});

test('waitLeader reconnects a lost connection and learns the campaign was won', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'session.open') return { session: 5, resumed: !!req.params.resume, ttl_ms: 1500, grace_ms: 5000 };
      if (req.method === 'lease.release') return { released: true };
      if (conn.index === 0) {
        // campaigning; then the connection drops before lease.changed comes
        setTimeout(() => conn.sock.destroy(), 30);
        return { name: 'w', leader: false, epoch: 0, valid_ms: 0, valid_until_mono_ms: 0, campaigning: true, ttl_ms: 1000 };
      }
      // asked again after the resume: won meanwhile
      return { name: 'w', leader: true, epoch: 3, valid_ms: 900, valid_until_mono_ms: 0, campaigning: false, ttl_ms: 1000 };
    },
    async (c, fake) => {
      await c.sessionOpen('w');
      const lead = await c.elect('w', { signal: AbortSignal.timeout(3000) });
      assert.equal(lead.epoch, 3);
      assert.equal(fake.conns.length, 2);
      assert.deepEqual(fake.conns[1].requests.map((q) => q.method), ['session.open', 'lease.acquire']);
      await lead.release();
    },
  );
});

test('an aborted claim releases the id only when an attempt was sent', async () => {
  await withFake(
    (req) => {
      if (req.method === 'permit.release') return { id: req.params.id, released: true, state: 'released' };
      return undefined; // claims hang
    },
    async (c, fake) => {
      await rejectsWith(c.claim('a1', 'q', { signal: AbortSignal.abort() }), 'aborted');
      assert.equal(fake.conns[0].requests.length, 0, 'nothing sent, nothing to release');
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 50);
      const e = await c.claim('a2', 'q', { signal: ac.signal }).catch((x) => x);
      assert.ok(e instanceof GaveUpError, String(e));
      assert.equal(e.last.code, 'aborted');
      assert.equal(e.released, true);
      assert.deepEqual(fake.conns[0].requests.map((q) => [q.method, q.params.id]), [
        ['permit.claim', 'a2'],
        ['permit.release', 'a2'],
      ]);
    },
  );
});

test('keepaliveMs goes with session.open and its resume; a bad one is refused before anything is sent', async () => {
  await rejectsWith(Client.connect({ socketPath: path.join(tmp, 'nobody.sock'), keepaliveMs: 1.5 }), 'bad_argument');
  await withFake(
    (req, conn) => {
      if (req.method === 'session.open') {
        return { session: 9, resumed: !!req.params.resume, ttl_ms: 1500, grace_ms: 5000,
          keepalive_ms: req.params.keepalive_ms ?? 0 };
      }
      if (conn.index === 0 && conn.requests.length === 2) {
        conn.sock.destroy();
        return undefined;
      }
      return { session: 9, live: true, last_heartbeat_ms_ago: 3, keepalive_ms: 400, next_due_ms: 400 };
    },
    async (c, fake) => {
      await rejectsWith(c.sessionOpen('k', { keepaliveMs: -1 }), 'bad_argument');
      await rejectsWith(c.sessionOpen('k', { keepaliveMs: '400' }), 'bad_argument');
      assert.equal(fake.conns[0].requests.length, 0);
      const s = await c.sessionOpen('k');
      assert.equal(s.keepalive_ms, 400);
      assert.deepEqual(fake.conns[0].requests[0].params, { name: 'k', keepalive_ms: 400 });
      await rejectsWith(c.keepalive(), 'connection_lost');
      const k = await c.keepalive();
      assert.deepEqual([k.keepalive_ms, k.next_due_ms], [400, 400]);
      // the resume names the session's keepalive_ms again
      assert.deepEqual(fake.conns[1].requests[0].params, { resume: 9, keepalive_ms: 400 });
    },
    { keepaliveMs: 400 },
  );
  await withFake(
    () => ({ session: 10, resumed: false, ttl_ms: 1500, grace_ms: 5000, keepalive_ms: 0 }),
    async (c, fake) => {
      // without the option, or with 0 for this session, none is asked for
      await c.sessionOpen('none');
      await c.sessionOpen('zero', { keepaliveMs: 0 });
      assert.deepEqual(fake.conns[0].requests.map((r) => r.params), [{ name: 'none' }, { name: 'zero' }]);
    },
  );
});

test('a session lost to a missed keepalive: session.lost, then keepalive() rejects with session_expired', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'session.open') return { session: 12, resumed: false, ttl_ms: 1500, grace_ms: 5000, keepalive_ms: 200 };
      conn.sock.write(encode([2, 'session.lost', [{ session: 12, reason: 'keepalive missed' }]]));
      return { session: 12, live: true, last_heartbeat_ms_ago: 1, keepalive_ms: 200, next_due_ms: 200 };
    },
    async (c, fake) => {
      const lost = [];
      c.on('session.lost', (p) => lost.push(p.reason));
      await c.sessionOpen('k', { keepaliveMs: 200 });
      await c.keepalive();
      assert.deepEqual(lost, ['keepalive missed']);
      assert.equal(c.sessionLost, true);
      await assert.rejects(c.keepalive(), (e) => e instanceof PgcoordError && e.code === 'session_expired' &&
        !e.retryable && /keepalive missed/.test(e.message));
      assert.equal(fake.conns[0].requests.length, 2, 'the lost session is not asked about again');
      // a new session clears it
      await c.sessionOpen('again');
      assert.equal(c.sessionLost, false);
    },
  );
});

test('watches: typed calls, their notifications as events, cancel, bad arguments refused', async () => {
  await withFake(
    (req, conn) => {
      if (req.method === 'watch.cancel') return { cancelled: req.params.watch === 3 };
      if (req.method === 'quota.watch') {
        setTimeout(() => conn.sock.write(encode([2, 'quota.changed', [{ watch: 3, key: req.params.key, exists: true,
          limit: 2, in_flight: 1, held: 1, uncertain: 0, room: 1, permits: 1 }]])), 5);
      }
      return { watch: { 'quota.watch': 3, 'permit.watch': 4, 'record.watch': 5 }[req.method], poll_ms: 100 };
    },
    async (c, fake) => {
      await rejectsWith(c.quotaWatch(''), 'bad_argument');
      await rejectsWith(c.permitWatch(7), 'bad_argument');
      await rejectsWith(c.recordWatch(null), 'bad_argument');
      await rejectsWith(c.watchCancel('3'), 'bad_argument');
      assert.equal(fake.conns[0].requests.length, 0);
      const changed = new Promise((resolve) => c.once('quota.changed', resolve));
      assert.deepEqual(await c.quotaWatch('q1'), { watch: 3, poll_ms: 100 });
      assert.deepEqual((await changed).room, 1);
      assert.equal((await c.permitWatch('p1')).watch, 4);
      assert.equal((await c.recordWatch('job')).watch, 5);
      assert.equal(await c.watchCancel(3), true);
      assert.equal(await c.watchCancel(4), false);
      assert.deepEqual(fake.conns[0].requests.map((r) => [r.method, r.params]), [
        ['quota.watch', { key: 'q1' }], ['permit.watch', { id: 'p1' }], ['record.watch', { kind: 'job' }],
        ['watch.cancel', { watch: 3 }], ['watch.cancel', { watch: 4 }]]);
    },
  );
});

const QUEUED = { status: 'queued', id: 'w', position: 2, queued_at: 1000, deadline_at: 61000, mine: true, now_at: 1000 };

for (const outcome of ['permit.admitted', 'permit.expired']) {
  test(`claimWait: queued, then ${outcome}`, async () => {
    await withFake(
      (req, conn) => {
        if (req.method !== 'permit.claim') return { error: { code: 'method_not_found', message: 'x' } };
        assert.equal(req.params.wait_ms, 60000);
        setTimeout(() => {
          const p = { id: 'w', token: 7, state: 'held', phase: 'reserved', owner_session: 3, queued_ms: 40 };
          conn.sock.write(encode([2, outcome, [{ ...p, reason: 'wait_ms elapsed', now_at: 1040 }]]));
        }, 20);
        return QUEUED;
      },
      async (client) => {
        const heard = [];
        client.on(outcome, (p) => heard.push(p.id));
        const wait = client.claimWait('w', 'q', { waitMs: 60000 });
        if (outcome === 'permit.expired') {
          await assert.rejects(wait, (e) => e.code === 'expired' && /wait_ms elapsed/.test(e.message));
        } else {
          const r = await wait;
          assert.equal(r.granted, true);
          assert.equal(r.token, 7);
          assert.equal(r.queued_ms, 40);
        }
        assert.deepEqual(heard, ['w'], 'the notification reaches the listeners too');
      },
    );
  });
}

test('claimWait aborted: cancels, and releases an admission that came meanwhile', async () => {
  const sent = [];
  await withFake(
    (req) => {
      sent.push(req.method);
      if (req.method === 'permit.claim') return QUEUED;
      if (req.method === 'permit.cancel') return { id: 'w', cancelled: false, status: 'held', now_at: 2000 };
      return { id: 'w', released: true, state: 'released', released_at: 2001, now_at: 2001 };
    },
    async (client) => {
      const wait = client.claimWait('w', 'q', { waitMs: 60000, signal: AbortSignal.timeout(200) });
      await assert.rejects(wait, (e) => e.code === 'aborted');
    },
  );
  assert.deepEqual(sent, ['permit.claim', 'permit.cancel', 'permit.release']);
});

test('claimWait on a connection that breaks: connection_lost, retryable, at once', async () => {
  await withFake(
    (req, conn) => {
      setTimeout(() => conn.sock.destroy(), 20);
      return QUEUED;
    },
    async (client) => {
      const t0 = monoMs();
      await assert.rejects(client.claimWait('w', 'q', { waitMs: 60000 }), (e) => e.code === 'connection_lost' && e.retryable);
      assert.ok(monoMs() - t0 < 2000);
    },
  );
});
