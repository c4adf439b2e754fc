// MessagePack-RPC framing (PROTOCOL.md "Transport and framing",
// "Envelopes"): requests out, and a reader that splits the byte stream into
// messages, checks their envelopes and dates each one for the leader belief.

import { Decoder, Encoder } from '@msgpack/msgpack';
import { PgcoordError, protocolError } from './errors.js';

export const REQUEST = 0;
export const RESPONSE = 1;
export const NOTIFICATION = 2;
export const MAX_MSGID = 0xffffffff;

export type Params = Record<string, unknown>;

const encoder = new Encoder({ ignoreUndefined: true, useBigInt64: true });
const decoder = new Decoder({ useBigInt64: true });

/** [0, msgid, method, [params]]; no params is an empty params array. */
export function packRequest(msgid: number, method: string, params?: Params): Uint8Array {
  const p = params && Object.keys(params).length > 0 ? [params] : [];
  return encoder.encode([REQUEST, msgid, method, p]);
}

// Integers arrive as bigint when encoded 64-bit wide; those that fit a
// double exactly become numbers, so ids and tokens are plain numbers.
function normalize(v: unknown): unknown {
  if (typeof v === 'bigint') {
    return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) v[i] = normalize(v[i]);
    return v;
  }
  if (v !== null && typeof v === 'object' && !(v instanceof Uint8Array)) {
    const m = v as Record<string, unknown>;
    for (const k of Object.keys(m)) m[k] = normalize(m[k]);
    return m;
  }
  return v;
}

/** Where a scan of an incomplete object stopped: at the header of an item,
 * with that many items (it included) still to skip and so many seen. */
export interface ScanState {
  pos: number;
  pending: number;
  items: number;
}

/** Length of the one MessagePack object at the start of buf, or -1 when it is
 * not complete yet; throws on a byte no encoding starts with. Iterative, so a
 * deeply nested object from a broken peer cannot exhaust the stack. Given a
 * state, an incomplete scan records where it stopped and the next call (on
 * the same bytes, and more) resumes there: a message arriving in many chunks
 * is scanned once, not once per chunk. */
export function objectLength(buf: Uint8Array, state?: ScanState, maxItems = 1 << 24): number {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let pos = state?.pos ?? 0;
  let pending = state?.pending ?? 1; // objects still to skip
  let items = state?.items ?? 0;
  const need = (n: number): boolean => pos + n <= buf.length;
  let at = pos; // the header of the item being read
  // Stops at the item's header, with the item counted as still to skip.
  const incomplete = (left = pending): number => {
    if (state) {
      state.pos = at;
      state.pending = left;
      state.items = items;
    }
    return -1;
  };
  for (;;) {
    if (pending === 0) {
      if (state) {
        state.pos = 0;
        state.pending = 1;
        state.items = 0;
      }
      return pos;
    }
    at = pos;
    if (!need(1)) return incomplete();
    const b = buf[pos++];
    pending--;
    let skip = 0; // payload bytes after the header
    let children = 0;
    let lenBytes = 0; // width of a length field
    let mult = 0; // children per length unit (1 array, 2 map), 0 for bytes
    let extra = 0; // bytes after the length (ext type)
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) {
      // fixint, nil, bool
    } else if (b >= 0x80 && b <= 0x8f) children = 2 * (b & 0x0f);
    else if (b >= 0x90 && b <= 0x9f) children = b & 0x0f;
    else if (b >= 0xa0 && b <= 0xbf) skip = b & 0x1f;
    else {
      switch (b) {
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xca: case 0xce: case 0xd2: skip = 4; break;
        case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
        case 0xd4: skip = 2; break;
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xc4: case 0xd9: lenBytes = 1; break;
        case 0xc5: case 0xda: lenBytes = 2; break;
        case 0xc6: case 0xdb: lenBytes = 4; break;
        case 0xc7: lenBytes = 1; extra = 1; break;
        case 0xc8: lenBytes = 2; extra = 1; break;
        case 0xc9: lenBytes = 4; extra = 1; break;
        case 0xdc: lenBytes = 2; mult = 1; break;
        case 0xdd: lenBytes = 4; mult = 1; break;
        case 0xde: lenBytes = 2; mult = 2; break;
        case 0xdf: lenBytes = 4; mult = 2; break;
        default:
          throw protocolError(`the agent sent bytes that are not MessagePack (0x${b.toString(16)} at ${pos - 1})`);
      }
    }
    if (lenBytes) {
      if (!need(lenBytes)) return incomplete(pending + 1);
      const n = lenBytes === 1 ? buf[pos] : lenBytes === 2 ? view.getUint16(pos) : view.getUint32(pos);
      pos += lenBytes;
      if (mult) children = n * mult;
      else skip = n + extra;
    }
    if (!need(skip)) return incomplete(pending + 1);
    pos += skip;
    pending += children;
    items += children;
    if (items > maxItems) throw protocolError('the agent sent a message with too many items');
  }
}

export interface Response {
  kind: typeof RESPONSE;
  msgid: number;
  error: unknown;
  result: Record<string, unknown> | null;
  /** A moment before the agent sent it, in monotonic ms (see FrameReader). */
  stampMs: number;
}

export interface Notification {
  kind: typeof NOTIFICATION;
  method: string;
  params: Record<string, unknown>;
  stampMs: number;
}

export type Message = Response | Notification;

export function isMap(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array);
}

/** A decoded object as a response or a notification; a protocol error for
 * anything else (a client never receives requests). */
export function parseEnvelope(obj: unknown, stampMs = 0): Message {
  if (!Array.isArray(obj) || obj.length === 0) {
    throw protocolError('the agent sent a message that is not an array', obj);
  }
  if (obj[0] === RESPONSE && obj.length === 4) {
    const [, msgid, error, result] = obj;
    if (typeof msgid !== 'number' || !Number.isInteger(msgid) || msgid < 0 || msgid > MAX_MSGID) {
      throw protocolError('a response has a bad msgid', msgid);
    }
    if (error === null && !isMap(result)) {
      throw protocolError('a successful response has no result map', result);
    }
    return { kind: RESPONSE, msgid, error, result: isMap(result) ? result : null, stampMs };
  }
  if (obj[0] === NOTIFICATION && obj.length === 3) {
    const [, method, params] = obj;
    if (typeof method !== 'string' || !Array.isArray(params)) {
      throw protocolError('a notification has a bad method or params', obj);
    }
    if (params.length === 0) return { kind: NOTIFICATION, method, params: {}, stampMs };
    if (params.length === 1 && isMap(params[0])) {
      return { kind: NOTIFICATION, method, params: params[0], stampMs };
    }
    throw protocolError(`notification ${method} params are not one map`);
  }
  throw protocolError('the agent sent a message of unknown shape', obj);
}

/** Splits received chunks into messages, each dated with the moment the
 * socket's receive queue was last known empty before its first byte came:
 * the agent sent it after that moment (libpgcoord's rule, inbound.c). The
 * connection says when it knew the queue empty (noteQuiet). */
export class FrameReader {
  // Received bytes not yet handed out as messages: buf[start, end), grown
  // by doubling so a long message costs linear copying.
  private buf: Uint8Array = new Uint8Array(4096);
  private start = 0;
  private end = 0;
  private readonly scan: ScanState = { pos: 0, pending: 1, items: 0 };
  private stampMs = 0;
  quietMs = 0;
  /** Set when the stream broke; the messages before the break were still
   * handed back, so a notification sent just before garbage is not lost. */
  broken: PgcoordError | null = null;

  constructor(private readonly maxBuffer = 64 * 1024 * 1024) {}

  noteQuiet(atMs: number): void {
    this.quietMs = atMs;
  }

  /** Bytes of a message begun but not complete. */
  buffered(): number {
    return this.end - this.start;
  }

  private append(chunk: Uint8Array): void {
    if (this.start === this.end) this.start = this.end = 0;
    if (this.end + chunk.length > this.buf.length) {
      const live = this.end - this.start;
      let size = this.buf.length;
      while (size < live + chunk.length) size *= 2;
      const grown = size === this.buf.length ? this.buf : new Uint8Array(size);
      grown.set(this.buf.subarray(this.start, this.end), 0);
      this.buf = grown;
      this.end = live;
      this.start = 0;
    }
    this.buf.set(chunk, this.end);
    this.end += chunk.length;
  }

  feed(chunk: Uint8Array): Message[] {
    if (this.broken) throw this.broken;
    if (this.buffered() === 0) this.stampMs = this.quietMs;
    this.append(chunk);
    const out: Message[] = [];
    try {
      while (this.start < this.end) {
        const rest = this.buf.subarray(this.start, this.end);
        const n = objectLength(rest, this.scan);
        if (n < 0) {
          if (rest.length > this.maxBuffer) throw protocolError(`a message is over ${this.maxBuffer} bytes`);
          break;
        }
        let obj: unknown;
        try {
          obj = normalize(decoder.decode(rest.subarray(0, n)));
        } catch (e) {
          throw protocolError(`the agent sent bytes that are not MessagePack: ${(e as Error).message}`);
        }
        this.start += n;
        // Every message completed by this chunk shares one date: the
        // earliest that is safe for the first of them.
        out.push(parseEnvelope(obj, this.stampMs));
      }
    } catch (e) {
      this.broken = e instanceof PgcoordError ? e : protocolError(String(e));
      this.start = this.end = 0;
    }
    return out;
  }
}
