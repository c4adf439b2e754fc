// Typed errors: PgcoordError carries PROTOCOL.md's error code, its message
// and whether the same call with the same ids may be sent again; the
// client's own failures (connection lost, no reply in time, garbage from
// the agent) use codes of their own, as the Go and Python clients do.

/** The codes of PROTOCOL.md's error table, in its order. */
export const AGENT_CODES = [
  'invalid_request',
  'method_not_found',
  'invalid_params',
  'unavailable',
  'timeout',
  'busy',
  'not_found',
  'forbidden',
  'no_session',
  'session_expired',
  'conflict',
  'fenced',
  'superseded',
  'shutting_down',
  'internal',
  'too_large',
] as const;

export type AgentCode = (typeof AGENT_CODES)[number];

/** Failures found by the client itself, never sent by the agent. */
export type ClientCode =
  | 'connect' // the socket could not be reached; nothing was sent
  | 'connection_lost' // the connection broke with the call in flight
  | 'call_timeout' // no reply within the call's timeout
  | 'protocol' // the agent sent something PROTOCOL.md does not allow
  | 'closed' // the client was closed
  | 'aborted' // the caller's AbortSignal fired
  | 'bad_argument' // the caller passed a value of the wrong type
  | 'gave_up' // a claim ran out of retries after an unknown outcome
  | 'denied' // claimWait's claim could not even queue
  | 'expired' // claimWait's claim left the queue without admission
  | 'lease_lost'; // why a Leadership's signal was aborted

export type ErrorCode = AgentCode | ClientCode | (string & {});

const RETRYABLE: ReadonlySet<string> = new Set([
  'unavailable',
  'timeout',
  'busy',
  'shutting_down',
  'connect',
  'connection_lost',
  'call_timeout',
]);

// A call that failed with one of these may have taken effect unseen.
const OUTCOME_UNKNOWN: ReadonlySet<string> = new Set(['timeout', 'connection_lost', 'call_timeout']);

export class PgcoordError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  /** The call may have taken effect although no answer was seen. */
  readonly outcomeUnknown: boolean;

  constructor(
    code: ErrorCode,
    message: string,
    retryable?: boolean,
    options?: { cause?: unknown; outcomeUnknown?: boolean },
  ) {
    super(message ? `${code}: ${message}` : code, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'PgcoordError';
    this.code = code;
    this.retryable = retryable ?? RETRYABLE.has(code);
    this.outcomeUnknown = options?.outcomeUnknown ?? OUTCOME_UNKNOWN.has(code);
  }

  /** The same failure, named for one call (one broken connection fails many). */
  forCall(method: string): PgcoordError {
    return new PgcoordError(this.code, `${method}: ${this.detail}`, this.retryable, {
      cause: this,
      outcomeUnknown: this.outcomeUnknown,
    });
  }

  /** The message without its code prefix. */
  get detail(): string {
    const prefix = `${this.code}: `;
    return this.message.startsWith(prefix) ? this.message.slice(prefix.length) : this.message;
  }
}

/** A claim kept failing with retryable errors until its retry budget ran out
 * after an attempt whose outcome was unknown. The id was released (retired)
 * as PROTOCOL.md requires; `released` says whether that release succeeded
 * (undefined when the caller asked not to release). */
export class GaveUpError extends PgcoordError {
  readonly last: PgcoordError;
  readonly released: boolean | undefined;

  constructor(message: string, last: PgcoordError, released: boolean | undefined) {
    super('gave_up', message, false, { cause: last });
    this.name = 'GaveUpError';
    this.last = last;
    this.released = released;
  }
}

function describe(v: unknown): string {
  let s: string;
  try {
    s = JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? x.toString() : x)) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 200 ? s.slice(0, 200) + '…' : s;
}

export function protocolError(what: string, value?: unknown): PgcoordError {
  return new PgcoordError('protocol', value === undefined ? what : `${what}: ${describe(value)}`);
}

/** The error for a response's error map. A map that is not
 * {code, message, retryable} is a protocol error. */
export function errorFromWire(err: unknown): PgcoordError {
  if (typeof err !== 'object' || err === null || Array.isArray(err) || err instanceof Uint8Array) {
    return protocolError('the error of a response is not a map', err);
  }
  const m = err as Record<string, unknown>;
  const code = m.code;
  const message = m.message ?? '';
  if (typeof code !== 'string' || typeof message !== 'string') {
    return protocolError('the error of a response has no code/message', err);
  }
  // The agent's word on retryability wins over the table.
  const retryable = typeof m.retryable === 'boolean' ? m.retryable : undefined;
  return new PgcoordError(code, message, retryable);
}
