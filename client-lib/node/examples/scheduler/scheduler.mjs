#!/usr/bin/env node
// A tiny job scheduler on pgcoord: replicas share one fleet-wide quota per
// tenant, claim before dispatch with the job's intent committed alongside,
// release when the job completes, mark the permit uncertain when the fake
// connector drops, reconcile only while leader, and recover what dead
// replicas left: at boot, and each time the agent says a record's owner died.
//
//   scheduler.mjs [--socket PATH] run [--replica NAME] [--jobs N] [--tenants N]
//                 [--limit N] [--drop-every N] [--seconds S] [--stay]
//   scheduler.mjs [--socket PATH] permit-cycle [--id ID] [--quota KEY] [--limit N]
//
// run dispatches its jobs, then (with --stay) keeps following the records of
// replicas that die until SIGTERM or SIGINT, and prints what it did as JSON.
// permit-cycle claims and releases one id and prints the results as JSON.

import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, DEFAULT_SOCKET, PgcoordError } from '@pgcoord/client';

const KIND = 'scheduler.job';

/** Stands in for whatever runs the jobs (a cluster API, a queue). Every
 * dropEvery-th dispatch the connection drops before it confirms, so the
 * scheduler cannot know whether the job started. */
class Connector {
  constructor(dropEvery) {
    this.dropEvery = dropEvery;
    this.n = 0;
    this.running = new Set();
  }
  dispatch(job) {
    this.n++;
    if (this.dropEvery && this.n % this.dropEvery === 0) throw new Error(`connector dropped while dispatching ${job}`);
    this.running.add(job);
  }
  finish(job) {
    this.running.delete(job);
  }
  isRunning(job) {
    return this.running.has(job);
  }
}

const settledMeanwhile = (e) => e instanceof PgcoordError && ['forbidden', 'conflict', 'not_found'].includes(e.code);

/** Takes back the open records of dead sessions (a predecessor of this
 * replica, or any other of this uid) and settles their permits on evidence.
 * False when liveness could not be read: nothing was taken, try again later. */
async function recover(c, out) {
  for (;;) {
    const r = await c.recordRecover({ kinds: [KIND] });
    if (!r.liveness_read) {
      out.recovery = `liveness unreadable: ${r.reason}; trying again`;
      return false;
    }
    for (const rec of r.adopted) {
      // This fake connector knows no jobs of a dead process: gone.
      if (rec.permit) {
        try {
          await c.permitResolve(rec.permit, 'gone', `no job ${rec.key} in the connector`);
        } catch (e) {
          if (!settledMeanwhile(e)) throw e; // the reconciler settled it meanwhile
        }
      }
      await c.recordSettle(KIND, rec.key, 'abandoned', { token: rec.token });
      out.recovered.push(rec.key);
    }
    if (!r.remaining) return true;
  }
}

/** Recovers at boot and again whenever a record of KIND loses its owner.
 *
 * Recovering only at boot is not enough: a predecessor that died just before
 * this replica started may still be live in the database (its agent ends a
 * session at its next heartbeat after the resume grace), so its records are
 * left alone, and nobody would ask again. The watch pushes record.orphaned
 * once the owner is dead (and, on its first read, for what is orphaned
 * already); each push is a reason to recover. Resolves once the boot
 * recovery ran; `stop()` ends the following. */
async function followTheDead(c, out) {
  let pending = false;
  let wake = null;
  let stopping = false;
  const poke = () => {
    pending = true;
    wake?.();
  };
  // session.resumed: the watch reads afresh; recovering again is safe
  c.on('record.orphaned', (p) => p.kind === KIND && poke());
  c.on('session.resumed', poke);
  await c.recordWatch(KIND); // before the first recovery: nothing dies unseen
  const once = async () => {
    let done = false;
    try {
      done = await recover(c, out);
    } catch (e) {
      if (!(e instanceof PgcoordError)) throw e;
      out.errors.push(`recovery: ${e.message}`);
    }
    // the database was unreachable: try again in a while
    if (!done) setTimeout(poke, 1000).unref();
  };
  await once(); // at boot, before taking new work
  const loop = (async () => {
    while (!stopping) {
      if (!pending) await new Promise((resolve) => (wake = resolve));
      wake = null;
      if (stopping) return;
      pending = false;
      await once();
    }
  })();
  return {
    stop: async () => {
      stopping = true;
      wake?.();
      await loop;
    },
  };
}

/** Only while leader: settle the permits marked uncertain, on evidence. */
async function reconcileLoop(c, connector, stop, out) {
  while (!stop.aborted) {
    let lead;
    try {
      lead = await c.elect('scheduler.reconciler', { ttlMs: 3000, signal: stop });
    } catch (e) {
      if (!stop.aborted) out.errors.push(e.message);
      await sleep(200).catch(() => {});
      continue;
    }
    try {
      while (lead.lease.valid && !stop.aborted) {
        const { permits } = await c.permitList({ state: 'uncertain', signal: lead.signal });
        for (const p of permits) {
          if (!lead.lease.valid) break; // lost the lease mid-pass: stop at once
          const outcome = connector.isRunning(p.id) ? 'running' : 'gone';
          try {
            await c.permitResolve(p.id, outcome, `connector says ${outcome}`);
            out.reconciled.push(p.id);
            if (outcome === 'running') {
              connector.finish(p.id);
              await c.release(p.id);
            }
          } catch (e) {
            if (!settledMeanwhile(e)) throw e; // another uid's, or settled meanwhile
          }
        }
        await sleep(200, undefined, { signal: stop }).catch(() => {});
      }
    } catch (e) {
      if (!stop.aborted && !lead.signal.aborted) out.errors.push(e.message);
    } finally {
      await lead.release().catch(() => {});
    }
  }
}

async function run(o) {
  const out = { replica: o.replica, completed: [], denied: 0, uncertain: [], reconciled: [], recovered: [], errors: [] };
  const connector = new Connector(o.dropEvery);
  // SIGTERM or SIGINT: stop dispatching, finish cleanly
  const quit = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => quit.abort());
  const c = await Client.connect({ socketPath: o.socket });
  try {
    await c.sessionOpen(`scheduler ${o.replica}`);
    const follower = await followTheDead(c, out);
    const stop = new AbortController();
    const leader = reconcileLoop(c, connector, stop.signal, out);
    const end = Date.now() + o.seconds * 1000;
    for (let n = 0; n < o.jobs && Date.now() <= end && !quit.signal.aborted; n++) {
      const tenant = `tenant-${n % o.tenants}`;
      const job = `${o.replica}-job-${n}`;
      const intent = JSON.stringify({ job, image: 'worker:1', tenant });
      let p;
      try {
        // Claim before dispatch: the intent is committed with the permit.
        p = await c.claim(job, { [tenant]: 1 }, { intent, limit: o.limit });
      } catch (e) {
        if (e instanceof PgcoordError && e.code === 'gave_up') {
          out.errors.push(e.message);
          continue;
        }
        throw e;
      }
      if (!p.granted) {
        out.denied++;
        await sleep(20);
        continue;
      }
      await c.recordPut(KIND, job, 'dispatching', { permit: job });
      try {
        connector.dispatch(job);
      } catch (e) {
        // We cannot know whether it runs: keep counting it, say why.
        await c.markUncertain(job, e.message);
        await c.recordSettle(KIND, job, 'handed-to-reconciler');
        out.uncertain.push(job);
        continue;
      }
      await c.permitUpdate(job, 'running');
      await c.recordUpdate(KIND, job, { state: 'running' });
      await sleep(1 + Math.random() * 9); // the job's work
      connector.finish(job);
      await c.release(job);
      await c.recordSettle(KIND, job, 'done');
      out.completed.push(job);
    }
    // give the reconciler a moment for the last uncertain permits
    const deadline = Date.now() + 3000;
    while (Date.now() < deadline && o.jobs && out.uncertain.some((j) => !out.reconciled.includes(j))) await sleep(100);
    if (o.stay && !quit.signal.aborted) {
      console.error(`scheduler ${o.replica}: jobs dispatched; following the records of dead replicas until SIGTERM`);
      await new Promise((resolve) => quit.signal.addEventListener('abort', resolve, { once: true }));
    }
    stop.abort();
    await leader;
    await follower.stop();
    await c.sessionClose();
  } finally {
    c.close();
  }
  console.log(JSON.stringify(out));
  return 0;
}

async function permitCycle(o) {
  const c = await Client.connect({ socketPath: o.socket });
  let s, claim, released, quota;
  try {
    s = await c.sessionOpen('scheduler permit-cycle');
    claim = await c.claim(o.id, { [o.quota]: 1 }, { intent: new TextEncoder().encode('permit-cycle'), limit: o.limit });
    released = claim.granted ? await c.release(o.id) : null;
    quota = (await c.quotaGet(o.quota)).quota;
    await c.sessionClose();
  } finally {
    c.close();
  }
  console.log(
    JSON.stringify({
      session: s.session,
      claim: { status: claim.status, id: claim.id, token: claim.token ?? null, mine: claim.mine ?? null, attempts: claim.attempts },
      release: released && { released: released.released, state: released.state },
      quota: { key: quota.key, limit: quota.limit, in_flight: quota.in_flight },
    }),
  );
  return claim.granted && released?.released ? 0 : 1;
}

async function main(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      socket: { type: 'string', default: DEFAULT_SOCKET },
      replica: { type: 'string', default: `replica-${process.pid}` },
      jobs: { type: 'string', default: '50' },
      tenants: { type: 'string', default: '3' },
      limit: { type: 'string' },
      'drop-every': { type: 'string', default: '7' },
      seconds: { type: 'string', default: '30' },
      stay: { type: 'boolean', default: false },
      id: { type: 'string', default: `permit-cycle-${process.pid}-${Date.now()}` },
      quota: { type: 'string', default: 'permit-cycle' },
    },
  });
  const int = (name, v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} wants a whole number, not ${JSON.stringify(v)}`);
    return n;
  };
  const mode = positionals[0];
  if (mode === 'run') {
    return run({
      socket: values.socket,
      replica: values.replica,
      jobs: int('jobs', values.jobs),
      tenants: Math.max(1, int('tenants', values.tenants)),
      limit: int('limit', values.limit ?? '2'),
      dropEvery: int('drop-every', values['drop-every']),
      seconds: Number(values.seconds),
      stay: values.stay,
    });
  }
  if (mode === 'permit-cycle') {
    return permitCycle({ socket: values.socket, id: values.id, quota: values.quota, limit: int('limit', values.limit ?? '1') });
  }
  throw new Error('usage: scheduler.mjs [--socket PATH] run|permit-cycle [options]');
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e) => {
    console.error(`scheduler: ${e.message}`);
    process.exit(e instanceof PgcoordError ? 3 : 2);
  },
);
