// Error maps from the agent become PgcoordError with code, message and
// retryable; anything else in their place is a protocol error.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AGENT_CODES, GaveUpError, PgcoordError, errorFromWire } from '../dist/index.js';

test('every PROTOCOL.md code maps to its retryability', () => {
  const retryable = new Set(['unavailable', 'timeout', 'busy', 'shutting_down']);
  assert.equal(AGENT_CODES.length, 16);
  for (const code of AGENT_CODES) {
    const e = errorFromWire({ code, message: 'm' });
    assert.ok(e instanceof PgcoordError);
    assert.ok(e instanceof Error);
    assert.equal(e.code, code);
    assert.equal(e.detail, 'm');
    assert.equal(e.message, `${code}: m`);
    assert.equal(e.retryable, retryable.has(code), code);
  }
  assert.equal(errorFromWire({ code: 'timeout', message: '' }).outcomeUnknown, true);
  assert.equal(errorFromWire({ code: 'unavailable', message: '' }).outcomeUnknown, false);
});

test("the agent's retryable wins over the table; unknown codes are kept", () => {
  assert.equal(errorFromWire({ code: 'busy', message: 'x', retryable: false }).retryable, false);
  assert.equal(errorFromWire({ code: 'conflict', message: 'x', retryable: true }).retryable, true);
  const e = errorFromWire({ code: 'brand_new', message: 'later agent', retryable: true });
  assert.equal(e.code, 'brand_new');
  assert.equal(e.retryable, true);
  assert.equal(errorFromWire({ code: 'brand_new', message: 'x' }).retryable, false);
});

test('an error that is not {code, message} is a protocol error', () => {
  for (const bad of ['oops', 7, [1, 2], null, { message: 'no code' }, { code: 5, message: 'x' }, { code: 'busy', message: 3 }]) {
    const e = errorFromWire(bad);
    assert.equal(e.code, 'protocol', JSON.stringify(bad));
    assert.equal(e.retryable, false);
  }
});

test('client-side failures: which may be retried and which may have taken effect', () => {
  assert.equal(new PgcoordError('connection_lost', 'x').retryable, true);
  assert.equal(new PgcoordError('connection_lost', 'x').outcomeUnknown, true);
  assert.equal(new PgcoordError('call_timeout', 'x').outcomeUnknown, true);
  assert.equal(new PgcoordError('connect', 'x').outcomeUnknown, false);
  assert.equal(new PgcoordError('protocol', 'x').retryable, false);
  const last = new PgcoordError('call_timeout', 'x');
  const g = new GaveUpError('gave up', last, true);
  assert.equal(g.code, 'gave_up');
  assert.equal(g.released, true);
  assert.equal(g.last, last);
  assert.equal(g.retryable, false);
});
