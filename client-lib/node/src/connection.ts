// One Unix-socket connection to the agent: requests out, responses matched
// to their calls by msgid, notifications handed on, every message dated for
// the leader belief. Once it fails it stays failed; the client makes a new
// one to reconnect.

import * as net from 'node:net';
import { monoMs } from './belief.js';
import { PgcoordError, errorFromWire } from './errors.js';
import { FrameReader, MAX_MSGID, NOTIFICATION, Notification, Params, Response, packRequest } from './framing.js';

/** How often the connection notes a moment its receive queue was empty. A
 * message is dated by the latest such moment before it was read, so this
 * bounds how much of valid_ms a quiet spell costs the belief. */
export const QUIET_SLICE_MS = 20;

/** Pauses between connects refused with EAGAIN: 1 ms doubling to 50 ms. */
const CONNECT_BACKOFF_FIRST_MS = 1;
const CONNECT_BACKOFF_MAX_MS = 50;

interface Pending {
  method: string;
  resolve: (m: Response) => void;
  reject: (e: PgcoordError) => void;
  /** Runs as the reply is read, in stream order with notifications. */
  onReply?: (m: Response) => void;
}

export interface ConnectionHandlers {
  onNotification(m: Notification): void;
  onFailure(conn: Connection, failure: PgcoordError): void;
}

export class Connection {
  private readonly pending = new Map<number, Pending>();
  private readonly frames = new FrameReader();
  private nextId = 0;
  private quietTimer: NodeJS.Timeout | undefined;
  failure: PgcoordError | null = null;

  private constructor(
    private readonly socket: net.Socket,
    private readonly handlers: ConnectionHandlers,
  ) {
    this.frames.noteQuiet(monoMs());
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (e) => this.fail(new PgcoordError('connection_lost', `the connection failed: ${e.message}`)));
    socket.on('close', () =>
      this.fail(
        new PgcoordError(
          'connection_lost',
          'the agent closed the connection' + (this.frames.buffered() ? ' in the middle of a message' : ''),
        ),
      ),
    );
    // A moment noted in a timer is safe to date later reads by only once
    // this loop iteration's poll has read what was queued before it: hence
    // the promotion in setImmediate (the check phase, after poll).
    this.quietTimer = setInterval(() => {
      const at = monoMs();
      setImmediate(() => this.frames.noteQuiet(at));
    }, QUIET_SLICE_MS);
    this.quietTimer.unref();
  }

  /** Connects within timeoutMs. A connect refused with EAGAIN (the agent's
   * accept queue, its listen_backlog, is full: a burst of connects it has not
   * caught up with) is retried with a short growing backoff until then; a
   * missing socket or an agent that is not listening fails at once. */
  static open(path: string, timeoutMs: number, handlers: ConnectionHandlers): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const deadline = monoMs() + timeoutMs;
      let pauseMs = CONNECT_BACKOFF_FIRST_MS;
      let lastBusy: Error | null = null;
      let socket: net.Socket | null = null;
      let retry: NodeJS.Timeout | undefined;
      let settled = false;
      const timer = setTimeout(() => {
        settled = true;
        clearTimeout(retry);
        socket?.destroy();
        const why = lastBusy ? ` while its accept queue stayed full (${lastBusy.message})` : '';
        reject(new PgcoordError('connect', `cannot connect to the agent at ${path}: no answer in ${timeoutMs} ms${why}`));
      }, timeoutMs);
      const attempt = (): void => {
        if (settled) return;
        const s = net.createConnection({ path });
        socket = s;
        s.once('error', (e: NodeJS.ErrnoException) => {
          s.destroy();
          if (settled) return;
          if (e.code === 'EAGAIN' || e.code === 'EINTR') {
            lastBusy = e;
            // Drawn from the pause's upper half, so a fleet restarting
            // together does not retry in step; never past the deadline.
            const wait = Math.min(pauseMs / 2 + Math.random() * (pauseMs / 2), Math.max(0, deadline - monoMs()));
            pauseMs = Math.min(pauseMs * 2, CONNECT_BACKOFF_MAX_MS);
            retry = setTimeout(attempt, wait);
            return;
          }
          settled = true;
          clearTimeout(timer);
          reject(new PgcoordError('connect', `cannot connect to the agent at ${path}: ${e.message}`));
        });
        s.once('connect', () => {
          settled = true;
          clearTimeout(timer);
          s.removeAllListeners('error');
          resolve(new Connection(s, handlers));
        });
      };
      attempt();
    });
  }

  get alive(): boolean {
    return this.failure === null;
  }

  /** Sends one request; the promise settles with its response (error maps
   * included) or rejects when the connection fails first. */
  send(method: string, params: Params | undefined, onReply?: (m: Response) => void): { msgid: number; reply: Promise<Response> } {
    if (this.failure) throw this.failure.forCall(method);
    // 1..2^32-1: msgid 0 is the agent's for errors about the stream itself.
    this.nextId = (this.nextId % MAX_MSGID) + 1;
    const msgid = this.nextId;
    const data = packRequest(msgid, method, params);
    const reply = new Promise<Response>((resolve, reject) => {
      this.pending.set(msgid, { method, resolve, reject, onReply });
    });
    this.socket.write(data);
    return { msgid, reply };
  }

  /** Stops waiting for a call (it timed out or was aborted); a late reply
   * is dropped. */
  forget(msgid: number): void {
    this.pending.delete(msgid);
  }

  fail(failure: PgcoordError): void {
    if (this.failure) return;
    this.failure = failure;
    clearInterval(this.quietTimer);
    this.socket.destroy();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) p.reject(failure.forCall(p.method));
    this.handlers.onFailure(this, failure);
  }

  close(): void {
    this.fail(new PgcoordError('closed', 'the client was closed'));
  }

  private onData(chunk: Buffer): void {
    if (this.failure) return;
    const messages = this.frames.feed(chunk);
    try {
      for (const m of messages) {
        if (this.failure) return;
        this.deliver(m);
      }
    } catch (e) {
      this.fail(e instanceof PgcoordError ? e : new PgcoordError('protocol', String(e)));
      return;
    }
    if (this.frames.broken) this.fail(this.frames.broken);
  }

  private deliver(m: Response | Notification): void {
    if (m.kind === NOTIFICATION) {
      this.handlers.onNotification(m);
      return;
    }
    const p = this.pending.get(m.msgid);
    if (!p) {
      // The agent refused the stream itself (framing, limits).
      if (m.msgid === 0 && m.error !== null) throw errorFromWire(m.error);
      return; // the answer to a call that timed out
    }
    this.pending.delete(m.msgid);
    p.onReply?.(m);
    p.resolve(m);
  }
}
