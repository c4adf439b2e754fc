// Leadership as the application holds it: a view of the local belief in one
// lease (no I/O), and elect()'s AbortSignal, aborted when the belief ends —
// before the lease can expire for anyone else.

import type { EventEmitter } from 'node:events';
import { Beliefs, monoMs } from './belief.js';
import { PgcoordError } from './errors.js';

/** The belief in one lease under one epoch. Every property reads the local
 * clock only; none does I/O. */
export class Lease {
  constructor(
    private readonly beliefs: Beliefs,
    readonly name: string,
    readonly epoch: number,
  ) {}

  /** Still leader: the agent's last word said so under this epoch and the
   * deadline on CLOCK_MONOTONIC lies ahead. */
  get valid(): boolean {
    return this.epoch !== 0 && this.beliefs.isLeader(this.name) && this.beliefs.epoch(this.name) === this.epoch;
  }

  /** CLOCK_MONOTONIC ms (monoMs()) at which belief ends; 0 when not leading. */
  get deadlineMs(): number {
    return this.valid ? this.beliefs.deadlineMs(this.name) : 0;
  }

  /** Milliseconds of belief left; 0 when not leading. */
  get validMs(): number {
    return this.valid ? this.beliefs.validMs(this.name) : 0;
  }
}

export interface Leadership {
  readonly name: string;
  readonly epoch: number;
  readonly lease: Lease;
  /** Aborted when the belief ends: its deadline passed without a renewal,
   * the agent said it ended, the session or connection was lost, or
   * release() was called. Check lease.valid before each step that needs
   * leadership too: a blocked event loop delays the abort, not the clock. */
  readonly signal: AbortSignal;
  /** Ends the leadership and hands the lease back. */
  release(): Promise<boolean>;
}

interface ReleasingClient extends EventEmitter {
  leaseRelease(name: string): Promise<boolean>;
}

export function startLeadership(client: ReleasingClient, beliefs: Beliefs, name: string): Leadership {
  const controller = new AbortController();
  const lease = new Lease(beliefs, name, beliefs.epoch(name));
  let timer: NodeJS.Timeout | undefined;
  const stop = (why: string): void => {
    clearTimeout(timer);
    client.off('notification', check);
    if (!controller.signal.aborted) controller.abort(new PgcoordError('lease_lost', `leadership of ${name}: ${why}`));
  };
  // Runs at the deadline and at every notification (a renewal moves the
  // deadline; lease.changed, session.lost and connection.lost end it).
  function check(): void {
    clearTimeout(timer);
    if (!lease.valid) return stop('the belief ended');
    timer = setTimeout(check, Math.max(1, lease.deadlineMs - monoMs()));
  }
  client.on('notification', check);
  check();
  return {
    name,
    epoch: lease.epoch,
    lease,
    signal: controller.signal,
    release: async () => {
      stop('released');
      return client.leaseRelease(name);
    },
  };
}
