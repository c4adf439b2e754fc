// The client's own leader belief, computed as libpgcoord does
// (client-lib/leases.c): a deadline on CLOCK_MONOTONIC, moved only by what
// the agent says, and checked against the clock at every question, so a
// silent or frozen agent still ends the belief in time. Nothing here does I/O.

/** CLOCK_MONOTONIC in milliseconds: process.hrtime is libuv's uv_hrtime,
 * which reads CLOCK_MONOTONIC on Linux, the clock valid_until_mono_ms is a
 * reading of (shared with an agent on the same host). */
export function monoMs(): number {
  return Number(process.hrtime.bigint() / 1_000_000n);
}

function isInt(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v);
}

/** stamp + valid_ms, capped by the agent's own monotonic deadline when it
 * sent one (0 means none). */
export function deadlineOf(params: Record<string, unknown>, stampMs: number, validMs: number): number {
  let until = stampMs + validMs;
  const mono = params.valid_until_mono_ms;
  if (isInt(mono) && mono > 0 && mono < until) until = mono;
  return until;
}

interface Belief {
  leader: boolean;
  epoch: number;
  untilMs: number;
  ttlMs: number;
}

/** (name, leader, epoch, valid_ms): leader only for a well-formed leading
 * message; null without a name. */
function read(p: Record<string, unknown>): [string, boolean, number, number] | null {
  const name = p.name;
  if (typeof name !== 'string' || name === '') return null;
  const { epoch, valid_ms: valid } = p;
  if (p.leader === true && isInt(epoch) && isInt(valid) && valid >= 0) return [name, true, epoch, valid];
  return [name, false, 0, 0];
}

/** Every lease this client's session may lead, by name. */
export class Beliefs {
  private readonly byName = new Map<string, Belief>();

  constructor(private readonly clock: () => number = monoMs) {}

  track(name: string): void {
    if (!this.byName.has(name)) this.byName.set(name, { leader: false, epoch: 0, untilMs: 0, ttlMs: 0 });
  }

  drop(name: string): void {
    this.byName.delete(name);
  }

  endAll(): void {
    this.byName.clear();
  }

  tracking(name: string): boolean {
    return this.byName.has(name);
  }

  /** Belief starts or ends, as a lease.changed or an acquire result says. */
  set(name: string, leader: boolean, epoch: number, untilMs: number, ttlMs = 0): void {
    if (!leader) {
      const b = this.byName.get(name);
      if (b) {
        b.leader = false;
        b.untilMs = 0;
      }
      return;
    }
    this.track(name);
    const b = this.byName.get(name)!;
    b.leader = true;
    b.epoch = epoch;
    b.untilMs = untilMs;
    if (ttlMs > 0) b.ttlMs = ttlMs;
  }

  /** Takes in a notification (dated stampMs) for the session sessionId. */
  note(method: string, params: Record<string, unknown>, stampMs: number, sessionId: number): void {
    switch (method) {
      case 'lease.changed': {
        const r = read(params);
        if (!r) return;
        const [name, leader, epoch, validMs] = r;
        // Only this client's session can lead for us.
        if (leader) {
          const s = params.session;
          if (sessionId === 0 || (isInt(s) && s !== sessionId)) return;
        }
        this.set(name, leader, epoch, deadlineOf(params, stampMs, validMs));
        return;
      }
      case 'lease.renewed': {
        const r = read(params);
        if (!r || !r[1]) return;
        const [name, , epoch, validMs] = r;
        // A renewal extends only a belief lease.changed (or the acquire
        // result) started, under the same epoch.
        const b = this.byName.get(name);
        if (b && b.leader && b.epoch === epoch) b.untilMs = deadlineOf(params, stampMs, validMs);
        return;
      }
      case 'session.lost':
        if (params.session === sessionId) this.endAll();
        return;
      case 'session.suspended': {
        // The session may be gone in safe_ms; no belief outlives it unless
        // a renewal comes first.
        const safe = params.safe_ms;
        if (params.session !== sessionId || !isInt(safe)) return;
        for (const b of this.byName.values()) {
          if (b.untilMs > stampMs + safe) b.untilMs = stampMs + Math.max(safe, 0);
        }
        return;
      }
    }
  }

  /** The monotonic ms at which belief ends; 0 when not leading. */
  deadlineMs(name: string): number {
    const b = this.byName.get(name);
    return b && b.leader ? b.untilMs : 0;
  }

  isLeader(name: string): boolean {
    const b = this.byName.get(name);
    return !!b && b.leader && this.clock() < b.untilMs;
  }

  /** The epoch of a belief still valid; 0 when not leading. */
  epoch(name: string): number {
    const b = this.byName.get(name);
    return b && b.leader && this.clock() < b.untilMs ? b.epoch : 0;
  }

  validMs(name: string): number {
    const b = this.byName.get(name);
    const now = this.clock();
    return b && b.leader && now < b.untilMs ? b.untilMs - now : 0;
  }
}
