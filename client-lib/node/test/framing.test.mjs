// Framing: requests as PROTOCOL.md spells them, the stream split into
// messages however it is chunked, garbage and bad envelopes refused, and
// messages dated by the moment the queue was last known empty.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode } from '@msgpack/msgpack';
import { FrameReader, objectLength, packRequest } from '../dist/index.js';

test('a request is [0, msgid, method, [params]], no params an empty array', () => {
  assert.deepEqual(decode(packRequest(5, 'agent.ping')), [0, 5, 'agent.ping', []]);
  assert.deepEqual(decode(packRequest(6, 'x', {})), [0, 6, 'x', []]);
  assert.deepEqual(decode(packRequest(7, 'x', { a: 1, b: undefined })), [0, 7, 'x', [{ a: 1 }]]);
  // integers stay integers, 64-bit ones too
  assert.deepEqual(decode(packRequest(8, 'x', { resume: 2n ** 40n }), { useBigInt64: true }), [0, 8, 'x', [{ resume: 2n ** 40n }]]);
});

test('objectLength measures every kind of object and waits for the rest', () => {
  const values = [
    null, true, false, 0, 127, -1, -32, 128, 300, 70000, 2 ** 40, -(2 ** 40), 1.5,
    '', 'a', 'x'.repeat(40), 'y'.repeat(300), 'z'.repeat(70000),
    new Uint8Array(3), new Uint8Array(300), [], [1, [2, [3]]], new Array(20).fill(1),
    {}, { a: { b: [1, 'c', { d: null }] } }, Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])),
  ];
  for (const v of values) {
    const bytes = encode(v);
    assert.equal(objectLength(bytes), bytes.length, JSON.stringify(v)?.slice(0, 40));
    for (let cut = 0; cut < Math.min(bytes.length, 50); cut++) {
      assert.equal(objectLength(bytes.subarray(0, cut)), -1);
      // a scan resumed where an incomplete one stopped ends in the same place
      const state = { pos: 0, pending: 1, items: 0 };
      assert.equal(objectLength(bytes.subarray(0, cut), state), -1);
      assert.equal(objectLength(bytes, state), bytes.length);
      assert.deepEqual(state, { pos: 0, pending: 1, items: 0 });
    }
  }
});

test('messages come out whole whatever the chunking', () => {
  const stream = Buffer.concat([
    encode([1, 1, null, { pong: true }]),
    encode([2, 'lease.changed', [{ name: 'x', leader: false }]]),
    encode([1, 2, { code: 'busy', message: 'later', retryable: true }, null]),
    encode([2, 'agent.db_up', []]),
  ]);
  for (const size of [1, 2, 3, 7, 64, stream.length]) {
    const r = new FrameReader();
    const got = [];
    for (let i = 0; i < stream.length; i += size) got.push(...r.feed(stream.subarray(i, i + size)));
    assert.equal(r.broken, null);
    assert.deepEqual(
      got.map((m) => (m.kind === 1 ? ['r', m.msgid, m.error?.code ?? null, m.result] : ['n', m.method, m.params])),
      [
        ['r', 1, null, { pong: true }],
        ['n', 'lease.changed', { name: 'x', leader: false }],
        ['r', 2, 'busy', null],
        ['n', 'agent.db_up', {}],
      ],
      `chunks of ${size}`,
    );
  }
});

test('garbage breaks the stream after handing back what came before it', () => {
  const r = new FrameReader();
  const got = r.feed(Buffer.concat([encode([2, 'agent.db_down', []]), Buffer.from([0xc1, 0x00])]));
  assert.equal(got.length, 1);
  assert.equal(r.broken.code, 'protocol');
  assert.throws(() => r.feed(encode([2, 'agent.db_up', []])), { code: 'protocol' });
});

test('envelopes that are not a response or notification are refused', () => {
  for (const bad of [
    'hello', 42, [], [0, 1, 'agent.ping', []], [1, 1, null], [1, -1, null, {}], [1, 2 ** 33, null, {}],
    [1, 'one', null, {}], [1, 1, null, 'not a map'], [2, 7, []], [2, 'x', {}], [2, 'x', [1, 2]], [9, 1, 2, 3],
  ]) {
    const r = new FrameReader();
    assert.deepEqual(r.feed(encode(bad)), [], JSON.stringify(bad));
    assert.equal(r.broken?.code, 'protocol', JSON.stringify(bad));
  }
});

test('a message is dated by the quiet moment before its first byte came', () => {
  const r = new FrameReader();
  r.noteQuiet(100);
  const bytes = encode([2, 'lease.renewed', [{ name: 'x' }]]);
  assert.deepEqual(r.feed(bytes.subarray(0, 3)), []);
  r.noteQuiet(200); // a later quiet moment does not date a message begun before it
  const [m] = r.feed(bytes.subarray(3));
  assert.equal(m.stampMs, 100);
  const [n] = r.feed(bytes);
  assert.equal(n.stampMs, 200);
});

test('a long message in small chunks is scanned once and comes out whole', () => {
  const big = encode([1, 9, null, { rows: Array.from({ length: 20000 }, (_, i) => ({ i, s: 'x'.repeat(i % 50) })) }]);
  const r = new FrameReader();
  const t0 = process.hrtime.bigint();
  let got = [];
  for (let i = 0; i < big.length; i += 512) got.push(...r.feed(big.subarray(i, i + 512)));
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  assert.equal(got.length, 1);
  assert.equal(got[0].result.rows.length, 20000);
  assert.equal(got[0].result.rows[19999].i, 19999);
  assert.equal(r.buffered(), 0);
  // rescanning from the start at each of these ~1300 chunks takes ten times as long
  assert.ok(ms < 5000, `${ms} ms`);
});

test('integers beyond 2^53 stay exact as bigint; others are numbers', () => {
  const r = new FrameReader();
  const [m] = r.feed(encode([1, 1, null, { small: 2 ** 40, big: 2n ** 62n }], { useBigInt64: true }));
  assert.equal(m.result.small, 2 ** 40);
  assert.equal(m.result.big, 2n ** 62n);
});
