// Small helpers the client's calls share: timeouts and AbortSignals around
// a reply, a sleep that an AbortSignal ends, and claim parameters.

import { PgcoordError } from './errors.js';
import type { Params } from './framing.js';
import type { QuotaSpec } from './types.js';

/** The caller's signal fired; sent says the request was on its way, so it
 * may still take effect. */
export function abortError(what: string, signal: AbortSignal, sent = false): PgcoordError {
  const why = signal.reason instanceof Error ? signal.reason.message : String(signal.reason ?? 'aborted');
  return new PgcoordError('aborted', `${what}: ${why}`, false, { cause: signal.reason, outcomeUnknown: sent });
}

/** The reply, or call_timeout after timeoutMs, or aborted when signal
 * fires; forget() is told when the call stops waiting. */
export function withCall<R>(
  reply: Promise<R>,
  method: string,
  timeoutMs: number,
  signal: AbortSignal | undefined,
  forget: () => void,
): Promise<R> {
  return new Promise<R>((resolve, reject) => {
    const onAbort = (): void => {
      finish();
      forget();
      reject(abortError(method, signal!, true));
    };
    const timer = setTimeout(() => {
      finish();
      forget();
      reject(new PgcoordError('call_timeout', `${method}: no reply within ${timeoutMs} ms; the outcome is unknown`));
    }, timeoutMs);
    const finish = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    reply.then(
      (v) => {
        finish();
        resolve(v);
      },
      (e) => {
        finish();
        reject(e);
      },
    );
  });
}

/** Resolves after ms, or rejects (aborted) as soon as signal fires. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError('sleep', signal));
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortError('sleep', signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export function badArgument(msg: string): PgcoordError {
  return new PgcoordError('bad_argument', msg);
}

/** PROTOCOL.md's quota list from a key, a {key: weight} map or the list. */
export function quotaParams(quotas: QuotaSpec): { key: string; weight: number }[] {
  if (typeof quotas === 'string') return [{ key: quotas, weight: 1 }];
  if (Array.isArray(quotas)) {
    return quotas.map((q) => {
      if (typeof q !== 'object' || q === null || typeof q.key !== 'string') {
        throw badArgument('each quota is {key: string, weight?: number}');
      }
      return { key: q.key, weight: q.weight ?? 1 };
    });
  }
  if (typeof quotas !== 'object' || quotas === null) {
    throw badArgument('quotas is a key, a {key: weight} object or a list of {key, weight}');
  }
  return Object.entries(quotas).map(([key, weight]) => {
    if (typeof weight !== 'number' || !Number.isInteger(weight)) throw badArgument(`the weight of ${key} is an integer`);
    return { key, weight };
  });
}

export function claimParams(
  id: string,
  quotas: QuotaSpec,
  intent: Uint8Array | string | undefined,
  onOwnerLoss: string | undefined,
  limit: number | undefined,
  waitMs?: number,
): Params {
  const p: Params = { id, quotas: quotaParams(quotas) };
  if (waitMs !== undefined && waitMs !== 0) {
    if (!Number.isSafeInteger(waitMs) || waitMs < 0) {
      throw new PgcoordError('bad_argument', 'waitMs is a whole number of milliseconds, 0 or more');
    }
    p.wait_ms = waitMs;
  }
  if (intent !== undefined) p.intent = intent;
  if (onOwnerLoss !== undefined) p.on_owner_loss = onOwnerLoss;
  if (limit !== undefined) p.limit = limit;
  return p;
}
