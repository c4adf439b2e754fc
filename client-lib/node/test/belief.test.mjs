// The leader belief (src/belief.ts) against a clock the test moves: the
// earlier of the two deadlines, which messages may start, move or end it,
// and that monoMs() reads CLOCK_MONOTONIC.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { Beliefs, deadlineOf, monoMs } from '../dist/index.js';

function clocked(start = 1000) {
  const clock = { now: start };
  return { clock, beliefs: new Beliefs(() => clock.now) };
}

test('deadlineOf takes the earlier of stamp + valid_ms and valid_until_mono_ms', () => {
  assert.equal(deadlineOf({}, 1000, 500), 1500);
  assert.equal(deadlineOf({ valid_until_mono_ms: 1400 }, 1000, 500), 1400);
  assert.equal(deadlineOf({ valid_until_mono_ms: 1600 }, 1000, 500), 1500);
  // 0 means the agent sent none; a non-integer is ignored
  assert.equal(deadlineOf({ valid_until_mono_ms: 0 }, 1000, 500), 1500);
  assert.equal(deadlineOf({ valid_until_mono_ms: 'x' }, 1000, 500), 1500);
});

test('a belief holds until its deadline on the clock, without any message', () => {
  const { clock, beliefs } = clocked();
  beliefs.set('x', true, 7, 1500);
  assert.equal(beliefs.isLeader('x'), true);
  assert.equal(beliefs.epoch('x'), 7);
  assert.equal(beliefs.validMs('x'), 500);
  clock.now = 1499;
  assert.equal(beliefs.isLeader('x'), true);
  clock.now = 1500;
  assert.equal(beliefs.isLeader('x'), false);
  assert.equal(beliefs.epoch('x'), 0);
  assert.equal(beliefs.validMs('x'), 0);
});

test("lease.changed starts a belief only for this client's session", () => {
  const { beliefs } = clocked();
  const msg = { name: 'x', leader: true, epoch: 3, valid_ms: 400, valid_until_mono_ms: 0, session: 9 };
  beliefs.note('lease.changed', msg, 1000, 8);
  assert.equal(beliefs.isLeader('x'), false, 'another session');
  beliefs.note('lease.changed', msg, 1000, 0);
  assert.equal(beliefs.isLeader('x'), false, 'no session of ours');
  beliefs.note('lease.changed', msg, 1000, 9);
  assert.equal(beliefs.deadlineMs('x'), 1400, 'dated by the stamp, not by when it was read');
  beliefs.note('lease.changed', { name: 'x', leader: false, epoch: 3, session: 9 }, 1100, 9);
  assert.equal(beliefs.isLeader('x'), false);
});

test('lease.renewed moves only a belief of the same epoch', () => {
  const { beliefs } = clocked();
  beliefs.set('x', true, 3, 1400);
  beliefs.note('lease.renewed', { name: 'x', leader: true, epoch: 4, valid_ms: 900 }, 1100, 9);
  assert.equal(beliefs.deadlineMs('x'), 1400);
  beliefs.note('lease.renewed', { name: 'x', leader: true, epoch: 3, valid_ms: 900, valid_until_mono_ms: 1800 }, 1100, 9);
  assert.equal(beliefs.deadlineMs('x'), 1800);
  // a renewal never starts a belief
  beliefs.note('lease.renewed', { name: 'y', leader: true, epoch: 3, valid_ms: 900 }, 1100, 9);
  assert.equal(beliefs.isLeader('y'), false);
});

test('session.suspended caps every belief at safe_ms; session.lost ends them', () => {
  const { beliefs } = clocked();
  beliefs.set('x', true, 3, 5000);
  beliefs.set('y', true, 4, 1100);
  beliefs.note('session.suspended', { session: 8, safe_ms: 200 }, 1000, 9);
  assert.equal(beliefs.deadlineMs('x'), 5000, 'another session');
  beliefs.note('session.suspended', { session: 9, safe_ms: 200 }, 1000, 9);
  assert.equal(beliefs.deadlineMs('x'), 1200);
  assert.equal(beliefs.deadlineMs('y'), 1100, 'an earlier deadline stays');
  beliefs.note('session.lost', { session: 9, reason: 'test' }, 1000, 9);
  assert.equal(beliefs.isLeader('x'), false);
  assert.equal(beliefs.isLeader('y'), false);
});

test('malformed lease messages never start a belief', () => {
  const { beliefs } = clocked();
  for (const bad of [
    { name: 'x', leader: true, epoch: 'one', valid_ms: 400, session: 9 },
    { name: 'x', leader: true, epoch: 1, valid_ms: -5, session: 9 },
    { name: 'x', leader: 1, epoch: 1, valid_ms: 400, session: 9 },
    { name: '', leader: true, epoch: 1, valid_ms: 400, session: 9 },
    { leader: true, epoch: 1, valid_ms: 400, session: 9 },
  ]) {
    beliefs.note('lease.changed', bad, 1000, 9);
    assert.equal(beliefs.isLeader('x'), false, JSON.stringify(bad));
  }
});

test('monoMs reads CLOCK_MONOTONIC (the clock of valid_until_mono_ms)', (t) => {
  const before = monoMs();
  let theirs;
  try {
    theirs = Number(
      execFileSync('python3', ['-c', 'import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000000)'], {
        encoding: 'utf8',
      }),
    );
  } catch {
    t.skip('python3 is not installed to read CLOCK_MONOTONIC');
    return;
  }
  const after = monoMs();
  assert.ok(before <= theirs && theirs <= after, `${before} <= ${theirs} <= ${after}`);
});
