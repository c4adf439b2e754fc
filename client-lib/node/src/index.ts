// @pgcoord/client: the Node/TypeScript client of pgcoord-agent
// (proto/PROTOCOL.md).

export { Client, DEFAULT_SOCKET } from './client.js';
export type { ClientOptions, SessionOpenOptions, ClaimOptions, ReleaseOptions, LeaseOptions, NotificationEvent } from './client.js';
export { PgcoordError, GaveUpError, AGENT_CODES, errorFromWire } from './errors.js';
export type { AgentCode, ClientCode, ErrorCode } from './errors.js';
export { Beliefs, deadlineOf, monoMs } from './belief.js';
export { Lease } from './leadership.js';
export type { Leadership } from './leadership.js';
export { FrameReader, packRequest, parseEnvelope, objectLength } from './framing.js';
export type { Message, Response, Notification } from './framing.js';
export type * from './types.js';
