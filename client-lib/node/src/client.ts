// The client: one connection to the local agent at a time, reconnecting
// and resuming its session within the grace; the leader belief kept as the
// replies and notifications are read; claims and releases retried with the
// same id; notifications as events and as an async iterator.

import { EventEmitter } from 'node:events';
import { Beliefs, deadlineOf, monoMs } from './belief.js';
import { Connection } from './connection.js';
import { GaveUpError, PgcoordError, errorFromWire } from './errors.js';
import { Notification, Params, Response, isMap } from './framing.js';
import { Lease, Leadership, startLeadership } from './leadership.js';
import { NotificationQueue } from './notifications.js';
import { abortError, badArgument, claimParams, sleep, withCall } from './util.js';
import type * as T from './types.js';

/** The array each paged list answers its rows in. */
const PAGED_LISTS: Record<T.PagedList, string> = {
  'lease.list': 'leases',
  'quota.list': 'quotas',
  'fleet.agents': 'agents',
  'fleet.sessions': 'sessions',
  'permit.list': 'permits',
  'record.list': 'records',
};

/** The page a walk of every page asks for: the cap of the lists that page
 * by 100 (lease.list, quota.list, fleet.*). */
const ALL_PAGE_SIZE = 1000;

export const DEFAULT_SOCKET = '/run/pgcoord/agent.sock';
// How long a resume waits for the agent to notice the old connection closed.
const RESUME_PATIENCE_MS = 2000;

export interface ClientOptions {
  /** The agent's socket (default /run/pgcoord/agent.sock). */
  socketPath?: string;
  /** Wait this long for each call's reply (default 5000). */
  timeoutMs?: number;
  connectTimeoutMs?: number;
  /** On a lost connection the next call connects again and resumes the
   * session while it is within the grace (default true). */
  reconnect?: boolean;
  /** How long claims and releases retry retryable errors with the same id
   * (default 10000). */
  retryMs?: number;
  /** Opens sessions with keepalive_ms (0 or absent: none; the agent takes
   * 100..600000): the application must then call keepalive() at least that
   * often, or the agent declares the session lost ("keepalive missed"),
   * lets its leases lapse and applies its permits' on_owner_loss rule.
   * The client starts no timer for it: call keepalive() from the code
   * doing the work it vouches for (see README.md). */
  keepaliveMs?: number;
}

export interface SessionOpenOptions extends T.CallOptions {
  /** This session's keepalive_ms instead of the client's keepaliveMs. */
  keepaliveMs?: number;
}

export interface ClaimOptions extends T.CallOptions {
  intent?: Uint8Array | string;
  onOwnerLoss?: 'uncertain' | 'release';
  limit?: number;
  /** 0..3600000: a claim that cannot be admitted now joins the queue for
   * that long and answers `queued`; its outcome comes as permit.admitted
   * or permit.expired (claimWait waits for it). */
  waitMs?: number;
  retryMs?: number;
  /** After an unknown outcome and no answer within retryMs, release the id
   * as PROTOCOL.md requires (default true). */
  giveUp?: boolean;
}

export interface ReleaseOptions extends T.CallOptions {
  override?: boolean;
  reason?: string;
  retryMs?: number;
}

export interface LeaseOptions extends T.CallOptions {
  ttlMs?: number;
  renewMs?: number;
  wait?: boolean;
}

/** A notification as the iterator and the 'notification' event hand it
 * out. The client adds two of its own: `connection.lost` and
 * `session.resumed`. */
export interface NotificationEvent {
  method: string;
  params: Record<string, unknown>;
}

function checkString(what: string, v: unknown): asserts v is string {
  if (typeof v !== 'string' || v === '') throw new PgcoordError('bad_argument', `${what} is a non-empty string`);
}

// keepalive_ms is whole milliseconds; the agent judges the range.
function checkKeepalive(v: unknown): asserts v is number | undefined {
  if (v !== undefined && (!Number.isSafeInteger(v) || (v as number) < 0)) {
    throw new PgcoordError('bad_argument', 'keepaliveMs is a whole number of milliseconds, 0 or more');
  }
}

function opt(obj: Params, extra: Params): Params {
  for (const [k, v] of Object.entries(extra)) if (v !== undefined) obj[k] = v;
  return obj;
}

/** claimWait's ear for its id: the outcome pushed for it, or the failure
 * of the connection it queued on (conn is set once it queued: a failure
 * before that was claim()'s to retry). */
interface Waiter {
  conn: Connection | null;
  outcome: NotificationEvent | null;
  failure: PgcoordError | null;
  wake: () => void;
}

export class Client extends EventEmitter {
  readonly socketPath: string;
  readonly timeoutMs: number;
  readonly connectTimeoutMs: number;
  readonly reconnect: boolean;
  readonly retryMs: number;
  readonly keepaliveMs: number;
  readonly beliefs = new Beliefs();
  /** The session this client opened (resumed after reconnects), if any. */
  session: T.SessionInfo | null = null;
  /** The session was lost: calls that need it fail until a new one is opened. */
  sessionLost = false;
  private lostReason = '';
  private lostAtMs = 0;
  private conn: Connection | null = null;
  private connecting: Promise<Connection> | null = null;
  private closed = false;
  private readonly leases = new Map<string, boolean>(); // name -> wait, re-asked after a resume
  private readonly queues = new Set<NotificationQueue<NotificationEvent>>();
  private readonly waiters = new Map<string, Waiter>(); // claimWait's, by permit id

  private constructor(opts: ClientOptions) {
    super();
    // Every elect() and waitLeader() listens while it lasts: many at once
    // are ordinary, not a leak.
    this.setMaxListeners(0);
    this.socketPath = opts.socketPath ?? DEFAULT_SOCKET;
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? 5000;
    this.reconnect = opts.reconnect ?? true;
    this.retryMs = opts.retryMs ?? 10000;
    checkKeepalive(opts.keepaliveMs);
    this.keepaliveMs = opts.keepaliveMs ?? 0;
  }

  /** Connects to the agent; rejects with code `connect` when it cannot. */
  static async connect(opts: ClientOptions = {}): Promise<Client> {
    const c = new Client(opts);
    c.conn = await c.open();
    return c;
  }

  // --- connection --------------------------------------------------------

  private open(): Promise<Connection> {
    return Connection.open(this.socketPath, this.connectTimeoutMs, {
      onNotification: (m) => this.onNotification(m),
      onFailure: (conn, failure) => this.onFailure(conn, failure),
    });
  }

  private onFailure(conn: Connection, failure: PgcoordError): void {
    // A broken connection ends every belief: nobody tells us anymore.
    this.beliefs.endAll();
    if (conn === this.conn && this.session && !this.lostAtMs) this.lostAtMs = monoMs();
    // What was pushed to the lost connection is not pushed again.
    this.failWaiters(`the connection broke: ${failure.detail}`, conn);
    if (this.closed) return; // the caller's own close is no news to it
    this.deliver('connection.lost', { reason: failure.message });
  }

  private async liveConn(): Promise<Connection> {
    if (this.closed) throw new PgcoordError('closed', 'the client was closed');
    if (this.conn?.alive) return this.conn;
    if (!this.reconnect) throw this.conn?.failure ?? new PgcoordError('connection_lost', 'not connected');
    // Concurrent calls share one reconnect (and one resume).
    this.connecting ??= this.reconnectNow().finally(() => {
      this.connecting = null;
    });
    return this.connecting;
  }

  private async reconnectNow(): Promise<Connection> {
    const conn = await this.open();
    if (this.closed) {
      conn.close();
      throw new PgcoordError('closed', 'the client was closed');
    }
    this.conn = conn;
    if (this.session && !this.sessionLost) await this.resume(conn);
    return conn;
  }

  /** Re-attaches the session on the new connection while the agent may
   * still hold it (within the grace); otherwise the session is lost. */
  private async resume(conn: Connection): Promise<void> {
    const s = this.session!;
    const lostAt = this.lostAtMs || monoMs();
    if (monoMs() - lostAt >= s.grace_ms) {
      this.sessionGone(`session ${s.session} was disconnected longer than its grace (${s.grace_ms} ms)`);
    }
    let m: Record<string, unknown>;
    for (;;) {
      try {
        // keepalive_ms again: it counts when this agent took the session
        // over from a crashed predecessor, which could not pass it on.
        const params = opt({ resume: s.session }, { keepalive_ms: s.keepalive_ms || undefined });
        m = await this.callOn(conn, 'session.open', params, {});
        break;
      } catch (e) {
        if (!(e instanceof PgcoordError)) throw e;
        if (e.code === 'conflict' && monoMs() - lostAt < Math.min(s.grace_ms, RESUME_PATIENCE_MS)) {
          // Still attached to the old connection: the agent has not seen it
          // close yet. Within the grace, ask again shortly.
          await sleep(20);
          continue;
        }
        if (e.code === 'session_expired' || e.code === 'not_found') {
          this.sessionGone(`session ${s.session} could not be resumed: ${e.detail}`);
        }
        throw e;
      }
    }
    const r = m as unknown as T.SessionInfo;
    if (r.session !== s.session) {
      conn.fail(new PgcoordError('protocol', `asked to resume session ${s.session}, the agent attached ${r.session}`));
      throw conn.failure!;
    }
    this.session = r;
    this.lostAtMs = 0;
    this.deliver('session.resumed', { session: r.session });
    // The agent kept the leases; ask again for the belief it holds.
    for (const [name, wait] of [...this.leases]) {
      try {
        await this.acquireOn(conn, name, { wait });
      } catch {
        // the next acquire (or lease.changed) tells
      }
    }
  }

  private sessionGone(why: string): never {
    this.sessionLost = true;
    this.beliefs.endAll();
    throw new PgcoordError('session_expired', why);
  }

  /** Closes the connection (the agent keeps the session for its grace; see
   * sessionClose to end it at once) and ends every notification iterator. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.conn?.close();
    for (const q of this.queues) q.end();
    this.queues.clear();
  }

  // --- calls -------------------------------------------------------------

  /** One request: the result map, or the agent's error as a rejected
   * PgcoordError. Reconnects (and resumes the session) when needed. */
  async call(method: string, params?: Params, opts: T.CallOptions = {}): Promise<Record<string, unknown>> {
    checkString('method', method);
    if (params !== undefined && params !== null && !isMap(params)) {
      throw new PgcoordError('bad_argument', `${method}: params is an object`);
    }
    if (opts.signal?.aborted) throw abortError(method, opts.signal);
    return this.callOn(await this.liveConn(), method, params ?? undefined, opts);
  }

  private callOn(
    conn: Connection,
    method: string,
    params: Params | undefined,
    opts: T.CallOptions,
    onReply?: (m: Response) => void,
  ): Promise<Record<string, unknown>> {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    let sent: { msgid: number; reply: Promise<Response> };
    try {
      sent = conn.send(method, params, onReply);
    } catch (e) {
      return Promise.reject(e);
    }
    return withCall(sent.reply, method, timeoutMs, opts.signal, () => conn.forget(sent.msgid)).then((m) => {
      if (m.error !== null) throw errorFromWire(m.error);
      return m.result!;
    });
  }

  private async typed<R>(method: string, params: Params | undefined, opts?: T.CallOptions): Promise<R> {
    return (await this.call(method, params, opts)) as unknown as R;
  }

  // --- paged lists (PROTOCOL.md, "Paging") ---------------------------------

  /** One page of a paged list (lease.list, quota.list, fleet.agents,
   * fleet.sessions, permit.list, record.list): its rows and the
   * next_cursor to pass as `cursor` for the next page (null after the
   * last). params are the list's filters; limit the page size (default:
   * the agent's). */
  async listPage<R = Record<string, unknown>>(
    method: T.PagedList,
    params: Params = {},
    o: T.CallOptions & { limit?: number; cursor?: string | null } = {},
  ): Promise<T.Page<R>> {
    const items = PAGED_LISTS[method];
    if (items === undefined) throw badArgument(`${String(method)} is not a paged list`);
    const p: Params = { ...params };
    delete p.limit;
    delete p.cursor;
    if (o.limit !== undefined) p.limit = o.limit;
    if (o.cursor !== undefined && o.cursor !== null) p.cursor = o.cursor;
    const r = await this.call(method, p, o);
    const rows = r[items];
    if (!Array.isArray(rows)) throw new PgcoordError('protocol', `the ${method} result has no ${items} list`);
    const next = r.next_cursor;
    return {
      items: rows as R[],
      next_cursor: typeof next === 'string' ? next : null,
      now_at: typeof r.now_at === 'number' ? r.now_at : undefined,
    };
  }

  /** Every page of a paged list, followed by its cursors (pages of
   * pageSize, default 1000; the timeout is per page): the rows in order
   * and the last page's now_at. The list may change between pages: a row
   * whose key does not change comes at most once. */
  async listAll<R = Record<string, unknown>>(
    method: T.PagedList,
    params: Params = {},
    o: T.CallOptions & { pageSize?: number } = {},
  ): Promise<{ items: R[]; now_at?: number }> {
    const items: R[] = [];
    let cursor: string | null = null;
    for (;;) {
      const page: T.Page<R> = await this.listPage<R>(method, params, { ...o, limit: o.pageSize ?? ALL_PAGE_SIZE, cursor });
      items.push(...page.items);
      if (page.next_cursor === null) return { items, now_at: page.now_at };
      cursor = page.next_cursor;
    }
  }

  // --- agent and fleet ------------------------------------------------------

  hello(client?: string, opts?: T.CallOptions): Promise<T.Hello> {
    return this.typed('agent.hello', opt({}, { client }), opts);
  }

  async ping(opts?: T.CallOptions): Promise<boolean> {
    return (await this.call('agent.ping', undefined, opts)).pong === true;
  }

  status(opts?: T.CallOptions): Promise<T.AgentStatus> {
    return this.typed('agent.status', undefined, opts);
  }

  /** Every page (listPage reads one). */
  async fleetAgents(opts?: T.CallOptions): Promise<{ agents: T.FleetAgent[]; now_at: number }> {
    const r = await this.listAll<T.FleetAgent>('fleet.agents', {}, opts);
    return { agents: r.items, now_at: r.now_at ?? 0 };
  }

  /** Every page (listPage reads one). */
  async fleetSessions(opts?: T.CallOptions): Promise<{ sessions: T.FleetSession[]; now_at: number }> {
    const r = await this.listAll<T.FleetSession>('fleet.sessions', {}, opts);
    return { sessions: r.items, now_at: r.now_at ?? 0 };
  }

  // --- sessions ------------------------------------------------------------

  /** session.open, with the client's keepaliveMs (or opts.keepaliveMs).
   * From then on the client resumes the session after a lost connection,
   * within its grace. */
  async sessionOpen(name?: string, opts: SessionOpenOptions = {}): Promise<T.SessionInfo> {
    checkKeepalive(opts.keepaliveMs);
    const keepalive = opts.keepaliveMs ?? this.keepaliveMs;
    const params = opt({}, { name, keepalive_ms: keepalive || undefined });
    const r = await this.typed<T.SessionInfo>('session.open', params, opts);
    this.session = r;
    this.sessionLost = false;
    this.lostReason = '';
    this.lostAtMs = 0;
    return r;
  }

  /** session.keepalive: the session is attached and live and, for one
   * opened with keepalive_ms, the application is: call it from the code
   * doing the work it vouches for, never from a free-running timer.
   * Rejects with session_expired once the session is lost. */
  keepalive(opts?: T.CallOptions): Promise<T.Keepalive> {
    if (this.session && this.sessionLost) {
      // Answered here: after a reconnect the agent could only say no_session.
      const why = this.lostReason ? `: ${this.lostReason}` : '';
      return Promise.reject(new PgcoordError('session_expired', `session ${this.session.session} was lost${why}`));
    }
    return this.typed('session.keepalive', undefined, opts);
  }

  async sessionClose(opts?: T.CallOptions): Promise<boolean> {
    this.beliefs.endAll();
    this.leases.clear();
    try {
      const r = await this.call('session.close', undefined, opts);
      this.session = null;
      return r.closed === true;
    } catch (e) {
      if (e instanceof PgcoordError && (e.code === 'no_session' || e.code === 'session_expired')) this.session = null;
      throw e;
    }
  }

  // --- notifications ---------------------------------------------------------

  private onNotification(m: Notification): void {
    // The belief moves here, as the message is read, before anyone is told.
    const sid = this.session?.session ?? 0;
    this.beliefs.note(m.method, m.params, m.stampMs, sid);
    if (m.method === 'session.lost' && m.params.session === sid) {
      this.sessionLost = true;
      this.lostReason = typeof m.params.reason === 'string' ? m.params.reason : '';
      this.failWaiters('the session was lost', null);
    }
    if (m.method === 'permit.admitted' || m.method === 'permit.expired') {
      const w = this.waiters.get(m.params.id as string);
      if (w && !w.outcome && !w.failure) {
        w.outcome = { method: m.method, params: m.params };
        w.wake();
      }
    }
    this.deliver(m.method, m.params);
  }

  // A listener that throws must not stop the reader or the other listeners.
  private deliver(method: string, params: Record<string, unknown>): void {
    for (const q of this.queues) q.push({ method, params });
    for (const [event, args] of [
      ['notification', [method, params]],
      [method, [params]],
    ] as const) {
      for (const fn of this.rawListeners(event)) {
        try {
          (fn as (...a: unknown[]) => void).apply(this, args as unknown as unknown[]);
        } catch {
          // a listener's bug is its own
        }
      }
    }
  }

  /** Every notification from now on, until the client closes or signal
   * fires. Unbounded: read it, or break out of the loop. */
  notifications(opts: { signal?: AbortSignal } = {}): AsyncIterableIterator<NotificationEvent> {
    const q = new NotificationQueue<NotificationEvent>(() => this.queues.delete(q));
    if (this.closed || opts.signal?.aborted) q.end();
    else {
      this.queues.add(q);
      opts.signal?.addEventListener('abort', () => q.end(), { once: true });
    }
    return q;
  }

  // --- leases --------------------------------------------------------------

  private async acquireOn(conn: Connection, name: string, o: LeaseOptions): Promise<T.LeaseAcquired> {
    const onReply = (m: Response): void => {
      // The result is the agent's belief when it answered, in stream order
      // with its notifications: apply it as it is read.
      const r = m.result;
      if (m.error !== null || !r) return;
      const leader =
        r.leader === true && Number.isInteger(r.valid_ms) && (r.valid_ms as number) >= 0 && Number.isInteger(r.epoch);
      const until = leader ? deadlineOf(r, m.stampMs, r.valid_ms as number) : 0;
      const ttl = Number.isInteger(r.ttl_ms) ? (r.ttl_ms as number) : 0;
      this.beliefs.set(name, leader, leader ? (r.epoch as number) : 0, until, ttl);
    };
    this.beliefs.track(name);
    const params = opt({ name, wait: !!o.wait }, { ttl_ms: o.ttlMs, renew_ms: o.renewMs });
    let r: T.LeaseAcquired;
    try {
      r = (await this.callOn(conn, 'lease.acquire', params, o, onReply)) as unknown as T.LeaseAcquired;
    } catch (e) {
      if (e instanceof PgcoordError && !e.retryable && !this.beliefs.isLeader(name)) this.beliefs.drop(name);
      throw e;
    }
    if (!r.leader && !o.wait) this.beliefs.drop(name);
    else this.leases.set(name, !!o.wait);
    return r;
  }

  /** lease.acquire; the local belief starts from its result. */
  async leaseAcquire(name: string, o: LeaseOptions = {}): Promise<T.LeaseAcquired> {
    checkString('a lease name', name);
    if (o.signal?.aborted) throw abortError('lease.acquire', o.signal);
    return this.acquireOn(await this.liveConn(), name, o);
  }

  /** Hands the lease back; the belief ends before the call is sent. */
  async leaseRelease(name: string, opts?: T.CallOptions): Promise<boolean> {
    checkString('a lease name', name);
    this.beliefs.drop(name);
    this.leases.delete(name);
    return (await this.call('lease.release', { name }, opts)).released === true;
  }

  leaseStatus(name: string, o: T.CallOptions & { watch?: boolean } = {}): Promise<T.LeaseStatus> {
    return this.typed('lease.status', opt({ name }, { watch: o.watch }), o);
  }

  /** Every lease, by name, over every page (listPage reads one). */
  async leaseList(opts?: T.CallOptions): Promise<{ leases: T.LeaseStatus[] }> {
    return { leases: (await this.listAll<T.LeaseStatus>('lease.list', {}, opts)).items };
  }

  /** The local belief: no I/O. */
  isLeader(name: string): boolean {
    return this.beliefs.isLeader(name);
  }

  /** A view of the belief in one lease (no I/O). */
  lease(name: string): Lease {
    return new Lease(this.beliefs, name, this.beliefs.epoch(name));
  }

  /** Resolves true once the belief in name starts, false after timeoutMs;
   * rejects when the session is lost or signal fires. */
  waitLeader(name: string, o: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<boolean> {
    return new Promise((resolve, reject) => {
      const end = o.timeoutMs === undefined ? Infinity : monoMs() + o.timeoutMs;
      let timer: NodeJS.Timeout | undefined;
      let finished = false;
      const done = (): void => {
        finished = true;
        clearTimeout(timer);
        this.off('notification', check);
        o.signal?.removeEventListener('abort', onAbort);
      };
      const onAbort = (): void => {
        done();
        reject(abortError('waiting for leadership', o.signal!));
      };
      const check = (): void => {
        if (finished) return;
        if (this.beliefs.isLeader(name)) {
          done();
          resolve(true);
        } else if (this.sessionLost || this.closed) {
          done();
          reject(new PgcoordError(this.closed ? 'closed' : 'session_expired', 'the session was lost while campaigning'));
        } else if (monoMs() >= end) {
          done();
          resolve(false);
        } else {
          // The campaign's news comes on the connection: get it back (and
          // the session, whose leases the resume asks after again).
          if (!this.conn?.alive && !this.connecting && this.reconnect) this.liveConn().then(check, check);
          clearTimeout(timer);
          timer = setTimeout(check, Math.min(250, end - monoMs()));
        }
      };
      if (o.signal?.aborted) return onAbort();
      o.signal?.addEventListener('abort', onAbort, { once: true });
      this.on('notification', check);
      check();
    });
  }

  /** Campaigns for name until it wins (or signal fires) and answers the
   * leadership: its `signal` is aborted before the lease can expire for
   * anyone else — when the belief's deadline passes without a renewal, the
   * lease is lost or released, or the session is lost. */
  async elect(name: string, o: LeaseOptions = {}): Promise<Leadership> {
    await this.leaseAcquire(name, { ...o, wait: true });
    try {
      await this.waitLeader(name, { signal: o.signal });
    } catch (e) {
      await this.leaseRelease(name).catch(() => undefined);
      throw e;
    }
    return startLeadership(this, this.beliefs, name);
  }

  // --- quotas --------------------------------------------------------------

  quotaSet(key: string, limit: number, o: T.CallOptions & { lapseAfterS?: number } = {}): Promise<T.QuotaSet> {
    return this.typed('quota.set', opt({ key, limit }, { lapse_after_s: o.lapseAfterS }), o);
  }

  quotaGet(key: string, opts?: T.CallOptions): Promise<{ quota: T.Quota; now_at: number }> {
    return this.typed('quota.get', { key }, opts);
  }

  /** Every quota, by key, over every page (listPage reads one). */
  async quotaList(opts?: T.CallOptions): Promise<{ quotas: T.Quota[]; now_at: number }> {
    const r = await this.listAll<T.Quota>('quota.list', {}, opts);
    return { quotas: r.items, now_at: r.now_at ?? 0 };
  }

  // --- watches -------------------------------------------------------------
  // What a watch pushes arrives as notifications (events and the iterator)
  // carrying its `watch` id: the first is the current state, then changes.

  /** Pushes `quota.changed` (T.QuotaChanged) when the quota's numbers
   * change; a key with no quota is fine (exists: false). */
  async quotaWatch(key: string, opts?: T.CallOptions): Promise<T.Watch> {
    checkString('a quota key', key);
    return this.typed('quota.watch', { key }, opts);
  }

  /** Pushes `permit.changed` (T.PermitChanged) when the permit's state,
   * phase, owner or token changes. */
  async permitWatch(id: string, opts?: T.CallOptions): Promise<T.Watch> {
    checkString('a permit id', id);
    return this.typed('permit.watch', { id }, opts);
  }

  /** Pushes `record.orphaned` (T.RecordOrphaned) for each open record of
   * the kind whose owner session is no longer live. */
  async recordWatch(kind: string, opts?: T.CallOptions): Promise<T.Watch> {
    checkString('a record kind', kind);
    return this.typed('record.watch', { kind }, opts);
  }

  /** Ends one of the session's watches; false when it was not one (say,
   * cancelled already). */
  async watchCancel(watch: number, opts?: T.CallOptions): Promise<boolean> {
    if (!Number.isSafeInteger(watch)) throw new PgcoordError('bad_argument', 'a watch id is an integer');
    return (await this.call('watch.cancel', { watch }, opts)).cancelled === true;
  }

  // --- permits -------------------------------------------------------------

  /** fn() until it answers or fails for good: retryable errors are retried
   * (reconnecting and resuming as needed) for retryMs. */
  private async retrying<R>(
    fn: () => Promise<R>,
    retryMs: number,
    signal: AbortSignal | undefined,
    state: { attempts: number; unknown: boolean },
  ): Promise<R> {
    const end = monoMs() + retryMs;
    let backoff = 50;
    for (;;) {
      state.attempts++;
      try {
        return await fn();
      } catch (e) {
        if (!(e instanceof PgcoordError)) throw e;
        state.unknown ||= e.outcomeUnknown;
        if (!e.retryable || this.closed || signal?.aborted || monoMs() + backoff >= end) throw e;
      }
      await sleep(backoff, signal).catch(() => undefined);
      backoff = Math.min(backoff * 2, 1000);
    }
  }

  /** permit.claim, retried with the same id on retryable errors (a lost
   * reply included) for retryMs. When it runs out after an attempt whose
   * outcome was unknown (or the caller aborts it after one was sent), the
   * id is released (giveUp) and the claim rejects with GaveUpError (code
   * `gave_up`). */
  async claim(id: string, quotas: T.QuotaSpec, o: ClaimOptions = {}): Promise<T.Claim> {
    checkString('a permit id', id);
    const params = claimParams(id, quotas, o.intent, o.onOwnerLoss, o.limit, o.waitMs);
    const state = { attempts: 0, unknown: false };
    let r: T.ClaimResult;
    try {
      r = (await this.retrying(
        () => this.call('permit.claim', params, o),
        o.retryMs ?? this.retryMs,
        o.signal,
        state,
      )) as unknown as T.ClaimResult;
    } catch (e) {
      if (!(e instanceof PgcoordError) || !state.unknown || !(e.retryable || e.code === 'aborted')) throw e;
      const released =
        o.giveUp === false ? undefined : await this.giveUp(id, { waiting: !!o.waitMs }).then(() => true, () => false);
      const how = released === undefined ? 'not released' : released ? 'id released' : 'release failed';
      throw new GaveUpError(`claim ${id}: gave up after ${e.message}; ${how}`, e, released);
    }
    const granted = r.status === 'admitted' || r.status === 'held';
    return { ...r, granted, attempts: state.attempts, earlier_outcome_unknown: state.unknown };
  }

  /** Releases an id whose claim's outcome was never seen, as PROTOCOL.md
   * requires: frees what a late attempt admitted, or retires the id so an
   * attempt still on its way is refused. `not_found` (retired) is success. */
  async giveUp(id: string, o: { retryMs?: number; waiting?: boolean } = {}): Promise<void> {
    // A claim that may have queued is not a permit yet, and a release does
    // not take it out of the queue: cancel it first.
    if (o.waiting && !(await this.cancelWait(id))) return;
    try {
      await this.release(id, { reason: 'given up after an unknown outcome', retryMs: o.retryMs });
    } catch (e) {
      if (!(e instanceof PgcoordError) || e.code !== 'not_found') throw e;
    }
  }

  /** Takes the session's waiting claim id out of the queue (`not_found`
   * when it is neither queued nor a permit). */
  permitCancel(id: string, opts?: T.CallOptions): Promise<T.PermitCancel> {
    checkString('a permit id', id);
    return this.typed('permit.cancel', { id }, opts);
  }

  /** permit.cancel; true when the claim was admitted meanwhile (the
   * caller owns a permit to release). */
  private async cancelWait(id: string): Promise<boolean> {
    try {
      const r = await this.permitCancel(id);
      return r.status === 'admitted' || r.status === 'held';
    } catch (e) {
      if (e instanceof PgcoordError && e.code === 'not_found') return false;
      throw e;
    }
  }

  /** Claims id with waitMs (> 0) and waits for the outcome: the admission
   * (at once or from the queue); rejects with code `expired` when it left
   * the queue without one, `denied` when it could not even queue. When
   * signal aborts, the claim is cancelled (a permit it was admitted to
   * meanwhile is released, so nothing leaks) and it rejects `aborted`. A
   * connection or session lost while waiting rejects `connection_lost`
   * (retryable): a retry with the same id answers the current state
   * (still queued: it waits on; admitted: `held`). */
  async claimWait(id: string, quotas: T.QuotaSpec, o: ClaimOptions & { waitMs: number }): Promise<T.Claim> {
    checkString('a permit id', id);
    if (!Number.isSafeInteger(o.waitMs) || o.waitMs <= 0) {
      throw new PgcoordError('bad_argument', 'claimWait needs waitMs, a whole number of milliseconds > 0');
    }
    if (this.waiters.has(id)) throw new PgcoordError('bad_argument', `claimWait of ${id} is already running`);
    const w: Waiter = { conn: null, outcome: null, failure: null, wake: () => {} };
    this.waiters.set(id, w);
    try {
      const c = await this.claim(id, quotas, o);
      if (c.status === 'denied') {
        const room = `${c.in_flight}/${c.limit} in flight, ${c.waiting ?? 0} waiting`;
        throw new PgcoordError('denied', `claim ${id}: no room in ${c.quota} (${room})`);
      }
      if (c.status !== 'queued') return c;
      // Its outcome is pushed to the session that queued it.
      if (c.mine === false) throw new PgcoordError('conflict', `claim ${id}: queued by another session`);
      w.conn = this.conn;
      if (!this.conn?.alive) w.failure = new PgcoordError('connection_lost', `waiting for ${id}: the connection broke`);
      return await this.awaitOutcome(id, w, c, o.signal);
    } finally {
      if (this.waiters.get(id) === w) this.waiters.delete(id);
    }
  }

  private async awaitOutcome(id: string, w: Waiter, c: T.Claim, signal: AbortSignal | undefined): Promise<T.Claim> {
    // The outcome is pushed; the timer only covers one pushed and lost.
    const leftMs = Number(c.deadline_at ?? 0) - Number(c.now_at ?? 0) + 5000;
    let why: 'heard' | 'aborted' | 'unheard' = 'heard';
    await new Promise<void>((resolve) => {
      if (w.outcome || w.failure) return resolve();
      const timer = setTimeout(() => {
        why = 'unheard';
        done();
      }, leftMs);
      const onAbort = () => {
        why = 'aborted';
        done();
      };
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      w.wake = done;
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
    });
    if (why === 'heard') {
      if (w.failure) throw w.failure;
      return outcomeClaim(id, w.outcome!);
    }
    // Given up or not heard: cancel; what was admitted meanwhile is
    // released (given up) or answered as held (not heard).
    let admitted = await this.cancelWait(id);
    admitted ||= w.outcome?.method === 'permit.admitted';
    if (why === 'aborted') {
      if (admitted) await this.release(id, { reason: 'waiting claim given up' });
      throw abortError(`waiting for ${id}`, signal!);
    }
    if (!admitted) {
      if (w.outcome) return outcomeClaim(id, w.outcome);
      throw new PgcoordError('expired', `claim ${id}: no outcome heard; cancelled`);
    }
    const g = await this.permitGet(id);
    const p = g.permit;
    return {
      status: 'held',
      id,
      token: p.token,
      state: p.state,
      phase: p.phase,
      owner_session: p.owner_session,
      owner_replica: p.owner_replica,
      mine: true,
      created_at: p.created_at,
      now_at: g.now_at,
      granted: true,
      attempts: 1,
      earlier_outcome_unknown: false,
    };
  }

  private failWaiters(why: string, conn: Connection | null): void {
    for (const [id, w] of this.waiters) {
      if (!w.conn || (conn && w.conn !== conn) || w.outcome || w.failure) continue;
      w.failure = new PgcoordError('connection_lost', `waiting for ${id}: ${why}`);
      w.wake();
    }
  }

  /** permit.release, retried with the same id on retryable errors
   * (releasing is idempotent). */
  async release(id: string, o: ReleaseOptions = {}): Promise<T.PermitRelease> {
    checkString('a permit id', id);
    const params = opt({ id }, { override: o.override, reason: o.reason });
    return (await this.retrying(
      () => this.call('permit.release', params, o),
      o.retryMs ?? this.retryMs,
      o.signal,
      { attempts: 0, unknown: false },
    )) as unknown as T.PermitRelease;
  }

  permitUpdate(id: string, phase: T.Phase, opts?: T.CallOptions): Promise<T.PermitUpdate> {
    return this.typed('permit.update', { id, phase }, opts);
  }

  markUncertain(id: string, reason: string, opts?: T.CallOptions): Promise<T.PermitMarked> {
    return this.typed('permit.mark_uncertain', { id, reason }, opts);
  }

  permitResolve(
    id: string,
    outcome: 'running' | 'gone',
    evidence: string,
    o: T.CallOptions & { override?: boolean } = {},
  ): Promise<T.PermitResolved> {
    return this.typed('permit.resolve', opt({ id, outcome, evidence }, { override: o.override }), o);
  }

  permitGet(id: string, opts?: T.CallOptions): Promise<{ permit: T.Permit; now_at: number }> {
    return this.typed('permit.get', { id }, opts);
  }

  /** The first page (up to limit, default 1000) by id; listAll and
   * listPage read every page or one from a cursor. */
  permitList(
    o: T.CallOptions & { quota?: string; state?: T.PermitState; phase?: string; owner?: number; limit?: number } = {},
  ): Promise<{ permits: T.Permit[]; truncated: boolean; now_at: number }> {
    const { quota, state, phase, owner, limit } = o;
    return this.typed('permit.list', opt({}, { quota, state, phase, owner, limit }), o);
  }

  permitHistory(id: string, opts?: T.CallOptions): Promise<{ id: string; events: T.PermitEvent[]; now_at: number }> {
    return this.typed('permit.history', { id }, opts);
  }

  permitCheck(opts?: T.CallOptions): Promise<T.Check> {
    return this.typed('permit.check', undefined, opts);
  }

  // --- records -------------------------------------------------------------

  recordPut(
    kind: string,
    key: string,
    state: string,
    o: T.CallOptions & { data?: Uint8Array | string; permit?: string } = {},
  ): Promise<{ created: boolean; record: T.PgRecord; now_at: number }> {
    return this.typed('record.put', opt({ kind, key, state }, { data: o.data, permit: o.permit }), o);
  }

  recordUpdate(
    kind: string,
    key: string,
    o: T.CallOptions & { state?: string; data?: Uint8Array | string; token?: number } = {},
  ): Promise<{ record: T.PgRecord; now_at: number }> {
    return this.typed('record.update', opt({ kind, key }, { state: o.state, data: o.data, token: o.token }), o);
  }

  recordSettle(
    kind: string,
    key: string,
    state: string,
    o: T.CallOptions & { token?: number } = {},
  ): Promise<{ record: T.PgRecord; now_at: number }> {
    return this.typed('record.settle', opt({ kind, key, state }, { token: o.token }), o);
  }

  recordGet(kind: string, key: string, opts?: T.CallOptions): Promise<{ record: T.PgRecord; now_at: number }> {
    return this.typed('record.get', { kind, key }, opts);
  }

  /** The first page (up to limit, default 1000) by kind and key; listAll
   * and listPage read every page or one from a cursor. */
  recordList(
    o: T.CallOptions & { kind?: string; owner?: number; liveOwner?: boolean; terminal?: boolean; limit?: number } = {},
  ): Promise<{ records: T.PgRecord[]; truncated: boolean; now_at: number }> {
    const p = opt({}, { kind: o.kind, owner: o.owner, live_owner: o.liveOwner, terminal: o.terminal, limit: o.limit });
    return this.typed('record.list', p, o);
  }

  recordRecover(
    o: T.CallOptions & { kinds?: string[]; limit?: number; dryRun?: boolean } = {},
  ): Promise<T.RecordRecovered> {
    return this.typed('record.recover', opt({}, { kinds: o.kinds, limit: o.limit, dry_run: o.dryRun }), o);
  }
}

/** claimWait's result from its notification (or an expiry as an error). */
function outcomeClaim(id: string, n: NotificationEvent): T.Claim {
  const p = n.params;
  if (n.method === 'permit.expired') {
    throw new PgcoordError('expired', `claim ${id}: left the queue: ${String(p.reason)}`);
  }
  const r = { ...p, status: 'admitted', mine: true } as unknown as T.ClaimResult;
  return { ...r, granted: true, attempts: 1, earlier_outcome_unknown: false };
}
