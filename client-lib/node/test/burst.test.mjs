// A connect refused because the agent's accept queue is full (EAGAIN: a
// burst of connects, or an agent not accepting for a moment) is retried
// within connectTimeoutMs, then fails naming the socket and the cause. A
// real agent with listen_backlog 1, stopped while its queue is filled (run
// under tests/harness/with-postgres). Skipped without a cluster.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, PgcoordError } from '../dist/index.js';
import { Agent, Database, haveFleet } from './fleet.mjs';

const skip = haveFleet() ? false : 'needs tests/harness/with-postgres and PGCOORD_TEST_AGENT_BIN';
let db, tmp, agent;
const held = [];

before(async () => {
  if (skip) return;
  tmp = mkdtempSync(path.join(process.env.PGCOORD_TEST_TMP || os.tmpdir(), 'node-burst.'));
  db = await Database.create();
  agent = await Agent.start(db, `node-burst-${process.pid}`, tmp, ['--listen-backlog', '1']);
});

after(async () => {
  if (skip) return;
  for (const s of held) s.destroy();
  await agent?.stop();
  await db?.close();
  rmSync(tmp, { recursive: true, force: true });
});

/** Stops the agent and connects until its queue says EAGAIN. */
async function stoppedFull() {
  agent.signal('SIGSTOP');
  for (let n = 0; n < 64; n++) {
    const s = net.createConnection({ path: agent.socketPath });
    const outcome = await new Promise((resolve) => {
      s.once('connect', () => resolve('connected'));
      s.once('error', (e) => resolve(e.code));
    });
    if (outcome === 'EAGAIN') {
      s.destroy();
      assert.ok(n > 0, 'the queue was full before any connect');
      return;
    }
    assert.equal(outcome, 'connected');
    held.push(s);
  }
  assert.fail('the accept queue took 64 connects and was not full');
}

test('a full accept queue is waited out within connectTimeoutMs', { skip }, async () => {
  await stoppedFull();
  setTimeout(() => agent.signal('SIGCONT'), 300);
  const t0 = Date.now();
  const c = await Client.connect({ socketPath: agent.socketPath, connectTimeoutMs: 5000 });
  const took = Date.now() - t0;
  try {
    assert.ok(took >= 250, `connected after ${took} ms, while the agent was stopped`);
    assert.equal(await c.ping(), true);
  } finally {
    c.close();
  }
});

test('a queue full past connectTimeoutMs: the connect error says so', { skip }, async () => {
  await stoppedFull();
  const t0 = Date.now();
  try {
    await assert.rejects(Client.connect({ socketPath: agent.socketPath, connectTimeoutMs: 400, reconnect: false }), (e) => {
      assert.ok(e instanceof PgcoordError);
      assert.equal(e.code, 'connect');
      assert.match(e.message, new RegExp(`${agent.socketPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*no answer in 400 ms while its accept queue stayed full`));
      return true;
    });
    const took = Date.now() - t0;
    assert.ok(took >= 390 && took < 1500, `gave up after ${took} ms of 400`);
  } finally {
    agent.signal('SIGCONT');
  }
  // no socket at all: at once
  const t1 = Date.now();
  await assert.rejects(Client.connect({ socketPath: agent.socketPath + '.missing', connectTimeoutMs: 5000 }), /ENOENT/);
  assert.ok(Date.now() - t1 < 500);
});
