// Typed results: one interface per result shape of PROTOCOL.md. Results
// are the agent's maps as decoded, so fields a newer agent adds are kept.
// Integers arrive as numbers (as bigint only beyond 2^53).

export type Int = number;
export type Bytes = Uint8Array;

export interface Hello {
  agent: string;
  version: string;
  protocol: Int;
  replica_id: string;
  incarnation: Int;
  max_message_bytes: Int;
}

export interface AgentStatus {
  replica_id: string;
  incarnation: Int;
  host: string;
  pid: Int;
  version: string;
  state: 'starting' | 'serving' | 'stopping' | 'superseded';
  db: 'up' | 'down';
  registered: boolean;
  schema_version: Int;
  schema_required: Int;
  sessions: Int;
  connections: Int;
  leases_held: Int;
  janitor: boolean;
  uptime_ms: Int;
  last_heartbeat_ms_ago: Int;
  db_reconnects: Int;
  db_queries: Int;
  db_failures: Int;
}

export interface SessionInfo {
  session: Int;
  resumed: boolean;
  ttl_ms: Int;
  grace_ms: Int;
  /** The keepalive the agent enforces on the session (0: none). */
  keepalive_ms: Int;
}

export interface Keepalive {
  session: Int;
  live: boolean;
  last_heartbeat_ms_ago: Int;
  /** The session's keepalive_ms (0: none); the next keepalive is due
   * within next_due_ms (0 without one). */
  keepalive_ms: Int;
  next_due_ms: Int;
}

export interface FleetAgent {
  replica_id: string;
  incarnation: Int;
  host: string;
  pid: Int;
  version: string;
  started_at: Int;
  heartbeat_at: Int;
  expires_at: Int;
  stopped_at: Int | null;
  live: boolean;
}

export interface FleetSession {
  session: Int;
  name: string;
  replica_id: string;
  incarnation: Int;
  opened_at: Int;
  expires_at: Int;
  owner_uid: Int | null;
}

export interface Holder {
  session: Int;
  replica_id: string;
}

export interface LeaseAcquired {
  name: string;
  leader: boolean;
  epoch: Int;
  valid_ms: Int;
  valid_until_mono_ms: Int;
  campaigning: boolean;
  ttl_ms: Int;
  holder: Holder | null;
  expires_in_ms: Int;
}

export interface LeaseStatus {
  name: string;
  epoch: Int;
  holder: Holder | null;
  expires_in_ms: Int;
  ttl_ms: Int;
  acquired_at: Int;
  renewed_at: Int;
  leader: boolean;
  valid_ms: Int;
}

export interface Quota {
  key: string;
  limit: Int;
  in_flight: Int;
  held: Int;
  uncertain: Int;
  available: Int;
  permits: Int;
  lapse_after_s: Int | null;
  created_at: Int;
  updated_at: Int;
}

export interface QuotaSet {
  key: string;
  limit: Int;
  in_flight: Int;
  lapse_after_s: Int | null;
  previous_limit: Int | null;
  created: boolean;
  now_at: Int;
}

/** A claim's result: `admitted`/`held` carry the permit, `denied` the first
 * quota without room, `queued` (with waitMs) its place in the queue. */
export interface ClaimResult {
  status: 'admitted' | 'held' | 'denied' | 'queued';
  id: string;
  now_at: Int;
  // admitted / held
  token?: Int;
  state?: PermitState;
  phase?: string;
  owner_session?: Int | null;
  owner_replica?: string | null;
  mine?: boolean;
  created_at?: Int;
  // denied (and queued: the quota it waits for)
  quota?: string;
  limit?: Int;
  in_flight?: Int;
  weight?: Int;
  /** denied: waiters queued on that quota */
  waiting?: Int;
  // queued: 1 is next in line; ms on the database clock
  position?: Int;
  queued_at?: Int;
  deadline_at?: Int;
  /** admitted from the queue (claimWait): how long it waited */
  queued_ms?: Int;
  // denied or queued: who holds the room (PROTOCOL.md, "Who holds the
  // room"); a queued answer has quota, limit and in_flight too
  /** open permits on the quota the caller may not see (another uid's) */
  hidden?: Int;
  /** the largest open permits the caller may see, at most 5 */
  holders?: QuotaHolder[];
}

/** One open permit holding a quota's room, in a denied or queued claim. */
export interface QuotaHolder {
  id: string;
  weight: Int;
  state: PermitState;
  owner_replica: string | null;
  owner_session: Int | null;
  /** since its claim */
  age_ms: Int;
  /** an uncertain one's reason */
  reason: string | null;
}

/** permit.cancel's result: `cancelled` when it left the queue; `admitted`
 * or `held` when the caller owns a permit it must release. */
export interface PermitCancel {
  id: string;
  cancelled: boolean;
  status: 'cancelled' | 'admitted' | 'held' | 'released';
  now_at: Int;
}

/** What claim() answers: the result, and how it was reached. */
export interface Claim extends ClaimResult {
  /** True for admitted and held. */
  granted: boolean;
  /** How many attempts the claim made (retries with the same id). */
  attempts: number;
  /** An earlier attempt's outcome was never seen. With `denied` that
   * attempt may still commit: give the id up (giveUp) unless retrying. */
  earlier_outcome_unknown: boolean;
}

export type PermitState = 'held' | 'uncertain' | 'released';
export type Phase = 'reserved' | 'dispatched' | 'running';

export interface PermitRelease {
  id: string;
  released: boolean;
  state: PermitState;
  released_at: Int | null;
  now_at: Int;
}

export interface PermitUpdate {
  id: string;
  phase: string;
  state: PermitState;
  changed: boolean;
  phase_at: Int;
  now_at: Int;
}

export interface PermitMarked {
  id: string;
  state: PermitState;
  changed: boolean;
  state_at: Int;
  now_at: Int;
}

export interface PermitResolved {
  id: string;
  state: PermitState;
  owner_session: Int | null;
  changed: boolean;
  detail: string | null;
  now_at: Int;
}

export interface Permit {
  id: string;
  token: Int;
  state: PermitState;
  phase: string;
  owner_session: Int | null;
  owner_replica: string | null;
  owner_live: boolean;
  on_owner_loss: 'uncertain' | 'release';
  uncertain_reason: string | null;
  quotas: { key: string; weight: Int }[];
  intent_bytes: Int;
  intent?: Bytes | null;
  redacted?: boolean;
  created_at: Int;
  phase_at: Int;
  state_at: Int;
  released_at: Int | null;
  age_ms: Int;
  phase_age_ms: Int;
  state_age_ms: Int;
}

export interface PermitEvent {
  seq: Int;
  event: string;
  quota: string | null;
  delta: Int;
  actor: string;
  reason: string | null;
  state: PermitState;
  phase: string;
  at: Int;
}

export interface CheckViolation {
  key: string;
  limit: Int;
  in_flight: Int;
  permit_weights: Int;
  audit_sum: Int;
  problem: string;
}

export interface Check {
  ok: boolean;
  quotas: Int;
  violations: CheckViolation[];
  now_at: Int;
}

export interface PgRecord {
  kind: string;
  key: string;
  state: string;
  terminal: boolean;
  data: Bytes | null;
  permit: string | null;
  owner_session: Int | null;
  owner_replica: string | null;
  owner_live: boolean;
  token: Int;
  created_at: Int;
  updated_at: Int;
  settled_at: Int | null;
  adopted_from: Int | null;
  adopted_at: Int | null;
  redacted?: boolean;
}

export interface RecordRecovered {
  liveness_read: boolean;
  dry_run: boolean;
  adopted: PgRecord[];
  permits: {
    id: string;
    state: PermitState;
    phase: string;
    token: Int;
    owner_session: Int | null;
    uncertain_reason: string | null;
  }[];
  left_alone: Int | null;
  remaining: Int | null;
  reason: string | null;
  now_at: Int | null;
}

/** What quota.watch, permit.watch and record.watch answer: `watch` names
 * it for watchCancel and is in every notification it pushes; `poll_ms` is
 * how often the agent reads what its sessions watch. */
export interface Watch {
  watch: Int;
  poll_ms: Int;
}

/** `quota.changed`: a watched quota changed (the first one after the watch
 * is its current state). Every number is 0 when `exists` is false. */
export interface QuotaChanged {
  watch: Int;
  key: string;
  exists: boolean;
  limit: Int;
  in_flight: Int;
  held: Int;
  uncertain: Int;
  /** max(limit - in_flight, 0) */
  room: Int;
  permits: Int;
}

/** `permit.changed`: a watched permit changed; all but `watch`, `id` and
 * `exists` are null when it does not exist. */
export interface PermitChanged {
  watch: Int;
  id: string;
  exists: boolean;
  state: PermitState | null;
  phase: string | null;
  token: Int | null;
  owner_session: Int | null;
  owner_replica: string | null;
  uncertain_reason: string | null;
  state_at: Int | null;
  phase_at: Int | null;
  released_at: Int | null;
}

/** `record.orphaned`: an open record of a watched kind whose owner session
 * is no longer live (record.recover would adopt it). */
export interface RecordOrphaned {
  watch: Int;
  kind: string;
  key: string;
  state: string;
  token: Int;
  owner_session: Int | null;
  owner_replica: string | null;
  owner_uid: Int | null;
  permit: string | null;
  updated_at: Int;
}

/** `session.lost`: the session is no longer live (reason `"keepalive
 * missed"` when the application stopped calling keepalive()). */
export interface SessionLost {
  session: Int;
  reason: string;
}

/** `{key: weight}`, a single key (weight 1), or PROTOCOL.md's list. */
export type QuotaSpec = string | Record<string, number> | { key: string; weight?: number }[];

/** The lists that answer a page at a time (PROTOCOL.md, "Paging"). */
export type PagedList = 'lease.list' | 'quota.list' | 'fleet.agents' | 'fleet.sessions' | 'permit.list' | 'record.list';

/** One page of a paged list: its rows, the cursor of the next page (null
 * after the last) and now_at (undefined for lists without one). */
export interface Page<R> {
  items: R[];
  next_cursor: string | null;
  now_at?: number;
}

export interface CallOptions {
  /** Aborts the wait for the reply: the call rejects with code `aborted`
   * (a request already sent may still take effect). */
  signal?: AbortSignal;
  /** Wait at most this long for the reply (default: the client's). */
  timeoutMs?: number;
}
