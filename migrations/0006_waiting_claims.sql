-- Waiting claims: a claim with wait_ms > 0 that finds no room joins one
-- fleet-wide FIFO queue instead of being denied, and is admitted inside the
-- transaction that frees room for it.
--
-- Order: a waiter's seq is drawn after its quota rows are locked, so on
-- each quota seq order is the order the waiters queued. Strict FIFO with
-- head-of-line blocking: a waiter is admitted only when no earlier queued
-- waiter shares one of its quotas and every one of its quotas has room for
-- its weight. A heavy head therefore blocks lighter waiters behind it; that
-- is what keeps heavy claims from starving (a caller that prefers
-- throughput claims with wait_ms 0 and retries itself).
--
-- Hand-over: quotas.waiting counts the queued waiters of each quota. A
-- trigger on quotas fires only when waiting > 0 and room grew (in_flight
-- fell: a release of any kind; limit rose: quota.set or a claim's limit)
-- and admits what now fits, at the commit of the same transaction. A waiter
-- that leaves the queue unadmitted (cancel, expiry, session end) re-runs
-- the hand-over itself, since the waiters behind it may now be first in
-- line.
--
-- No overtaking: while a quota has waiters, a second trigger makes every
-- admission that raises in_flight skip the row (the claim's UPDATE then
-- finds nothing: `denied`), except the hand-over itself, which says so in
-- the transaction-local setting pgcoord.handing_over.
--
-- Lock order as for permits (session rows, then quota rows in key order,
-- then permit rows). The hand-over runs while the freeing statement holds
-- the quota rows it changed, and locks the quota rows of each waiter it
-- admits in key order; a waiter holding several quotas can thus lock a
-- quota with a lower key than one already held. Two such transactions can
-- deadlock: Postgres detects it and aborts one, whose caller gets a
-- retryable error and whose retry finds what committed. Single-quota
-- waiters never do.

CREATE SEQUENCE pgcoord.waiter_seq;

-- One row per waiting claim. It stays after it left the queue (admitted or
-- expired) until the poll of the agent that queued it reported it to the
-- owning session, then it goes: an expired id is free again.
CREATE TABLE pgcoord.waiters (
	seq           bigint PRIMARY KEY DEFAULT nextval('pgcoord.waiter_seq'),
	id            text COLLATE "C" NOT NULL CHECK (octet_length(id) BETWEEN 1 AND 200),
	uid           bigint,
	session       bigint NOT NULL,
	replica       text NOT NULL,
	keys          text[] COLLATE "C" NOT NULL,
	weights       integer[] NOT NULL,
	intent        bytea,
	on_owner_loss text NOT NULL,
	actor         text NOT NULL,
	queued_at     timestamptz NOT NULL DEFAULT now(),
	deadline_at   timestamptz NOT NULL,
	state         text NOT NULL DEFAULT 'queued'
		CHECK (state IN ('queued', 'admitted', 'expired')),
	reason        text, -- why it expired
	left_at       timestamptz
);

CREATE UNIQUE INDEX waiters_queued_id ON pgcoord.waiters (id) WHERE state = 'queued';

CREATE INDEX waiters_by_session ON pgcoord.waiters (session);

CREATE INDEX waiters_to_report ON pgcoord.waiters (replica) WHERE state <> 'queued';

CREATE INDEX waiters_deadline ON pgcoord.waiters (replica, deadline_at) WHERE state = 'queued';

-- 1 + the queued waiters before this one that share one of its quotas.
CREATE FUNCTION pgcoord.waiter_position(p_seq bigint)
RETURNS bigint
LANGUAGE sql STABLE AS $$
	SELECT 1 + count(*) FROM pgcoord.waiters e, pgcoord.waiters w
	WHERE w.seq = p_seq AND e.state = 'queued' AND e.seq < w.seq AND e.keys && w.keys
$$;

-- Per quota with waiters: how long its queue is and who waits longest.
CREATE VIEW pgcoord.queue_status AS
	SELECT k.key, count(*) AS length, pgcoord.ms(now()) - pgcoord.ms(min(w.queued_at)) AS head_age_ms,
	       (array_agg(w.id ORDER BY w.seq))[1] AS oldest_id,
	       (array_agg(w.weights[array_position(w.keys, k.key)] ORDER BY w.seq))[1] AS head_weight
	FROM pgcoord.waiters w CROSS JOIN LATERAL unnest(w.keys) AS k(key)
	WHERE w.state = 'queued'
	GROUP BY k.key;

-- Queue heads that are first in line on every quota of theirs and fit:
-- the hand-over admits such a head in the commit that made room, so one
-- seen here (in one snapshot) is a hand-over that did not happen.
-- permit.check reports them.
CREATE FUNCTION pgcoord.stalled_queues()
RETURNS TABLE (key text, head_id text, head_age_ms bigint)
LANGUAGE sql STABLE AS $$
	SELECT k.key::text, w.id::text, pgcoord.ms(now()) - pgcoord.ms(w.queued_at)
	FROM pgcoord.waiters w CROSS JOIN LATERAL unnest(w.keys) AS k(key)
	WHERE w.state = 'queued'
	  AND NOT EXISTS (SELECT 1 FROM pgcoord.waiters e WHERE e.state = 'queued'
			  AND e.seq < w.seq AND e.keys && w.keys)
	  AND (SELECT count(*) = cardinality(w.keys) AND bool_and(q.in_flight + t.w <= q."limit")
	       FROM unnest(w.keys, w.weights) AS t(k, w) JOIN pgcoord.quotas q ON q.key = t.k)
	ORDER BY 1
$$;

-- queue_status for the agent's status page (the runtime role reads
-- through functions).
CREATE FUNCTION pgcoord.queues()
RETURNS SETOF pgcoord.queue_status
LANGUAGE sql STABLE AS $$
	SELECT * FROM pgcoord.queue_status
$$;

-- Admits, in seq order, the queued waiters on p_keys that are first in
-- line on every quota of theirs and fit. Returns how many it admitted.
-- Sequential scans off: planned on a fresh install, its quota lookups read
-- every quota row per waiter; quotas_pkey answers them by key.
CREATE FUNCTION pgcoord.waiters_admit(p_keys text[])
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	w pgcoord.waiters;
	v_prev text := current_setting('pgcoord.handing_over', true);
	v_fits boolean;
	v_token bigint;
	v_n integer := 0;
BEGIN
	PERFORM set_config('pgcoord.handing_over', 'on', true);
	FOR w IN SELECT * FROM pgcoord.waiters x WHERE x.state = 'queued' AND x.keys && p_keys
		 ORDER BY x.seq
	LOOP
		-- head-of-line: an earlier waiter on any of its quotas goes first
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgcoord.waiters e WHERE e.state = 'queued'
				      AND e.seq < w.seq AND e.keys && w.keys);
		PERFORM 1 FROM pgcoord.quotas q WHERE q.key = ANY (w.keys) ORDER BY q.key
		FOR NO KEY UPDATE;
		SELECT count(*) = cardinality(w.keys) AND bool_and(q.in_flight + t.w <= q."limit")
		INTO v_fits
		FROM unnest(w.keys, w.weights) AS t(k, w) JOIN pgcoord.quotas q ON q.key = t.k;
		CONTINUE WHEN NOT v_fits;
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, intent, quota_key, quota_weight)
		VALUES (w.id, nextval('pgcoord.token_seq'), w.session, w.replica, 'held', 'reserved',
			w.on_owner_loss, w.intent,
			CASE WHEN cardinality(w.keys) = 1 THEN (SELECT t.k FROM unnest(w.keys) AS t(k)) END,
			CASE WHEN cardinality(w.keys) = 1
			     THEN (SELECT t.w FROM unnest(w.weights) AS t(w)) END)
		ON CONFLICT (id) DO NOTHING
		RETURNING p.token INTO v_token;
		UPDATE pgcoord.quotas q SET waiting = q.waiting - 1,
			in_flight = q.in_flight + CASE WHEN v_token IS NULL THEN 0 ELSE t.w END
		FROM unnest(w.keys, w.weights) AS t(k, w) WHERE q.key = t.k;
		IF v_token IS NULL THEN
			-- the id got a permit meanwhile (a release retired it): it
			-- can never be granted, so it leaves the queue unadmitted
			UPDATE pgcoord.waiters x SET state = 'expired', left_at = now(),
				reason = 'the id was retired by a release'
			WHERE x.seq = w.seq;
			CONTINUE;
		END IF;
		-- the shares of two or more quotas (one is in the permit row)
		INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
		SELECT w.id, t.k, t.w FROM unnest(w.keys, w.weights) AS t(k, w)
		WHERE cardinality(w.keys) > 1;
		INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason, state,
			phase)
		SELECT w.id, t.k, t.w, 'admitted', w.actor,
		       'from the queue (waiter ' || w.seq || ')', 'held', 'reserved'
		FROM unnest(w.keys, w.weights) AS t(k, w) ORDER BY t.k;
		UPDATE pgcoord.waiters x SET state = 'admitted', left_at = now() WHERE x.seq = w.seq;
		v_n := v_n + 1;
	END LOOP;
	PERFORM set_config('pgcoord.handing_over', coalesce(v_prev, ''), true);
	RETURN v_n;
END $$;

CREATE FUNCTION pgcoord.quotas_hand_over()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pgcoord.waiters_admit(ARRAY[NEW.key]);
	RETURN NULL;
END $$;

-- Deferred to the commit of the freeing transaction: its quota rows are
-- still locked by it, and its own audit rows (the release) come before the
-- admissions they made room for.
CREATE CONSTRAINT TRIGGER quotas_hand_over AFTER UPDATE OF in_flight, "limit" ON pgcoord.quotas
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
	WHEN (NEW.waiting > 0 AND (NEW.in_flight < OLD.in_flight OR NEW."limit" > OLD."limit"))
	EXECUTE FUNCTION pgcoord.quotas_hand_over();

-- WAITING CLAIMS: nobody overtakes a queue. An immediate claim's counter
-- UPDATE (permit_claim) skips a quota row that has waiters, so the
-- claim is `denied` even when its weight would fit. A BEFORE ROW trigger
-- sees the latest row version under the row lock, as the claim's predicate
-- does; the hand-over alone may raise in_flight past a queue.
CREATE FUNCTION pgcoord.quotas_no_overtaking()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('pgcoord.handing_over', true) = 'on' THEN
		RETURN NEW;
	END IF;
	RETURN NULL;
END $$;

CREATE TRIGGER quotas_no_overtaking BEFORE UPDATE OF in_flight ON pgcoord.quotas
	FOR EACH ROW WHEN (NEW.in_flight > OLD.in_flight AND OLD.waiting > 0)
	EXECUTE FUNCTION pgcoord.quotas_no_overtaking();

-- A queued waiter leaves unadmitted: deleted (p_state NULL: its owner
-- cancelled or its session ended, nobody to tell) or marked expired for
-- its agent's poll to report. The waiters behind it may now be first.
CREATE FUNCTION pgcoord.waiter_leave(p_seq bigint, p_state text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	v_keys text[];
BEGIN
	SELECT w.keys INTO v_keys FROM pgcoord.waiters w WHERE w.seq = p_seq;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM 1 FROM pgcoord.quotas q WHERE q.key = ANY (v_keys) ORDER BY q.key
	FOR NO KEY UPDATE;
	IF p_state IS NULL THEN
		DELETE FROM pgcoord.waiters w WHERE w.seq = p_seq AND w.state = 'queued';
	ELSE
		UPDATE pgcoord.waiters w SET state = p_state, reason = p_reason, left_at = now()
		WHERE w.seq = p_seq AND w.state = 'queued';
	END IF;
	IF NOT FOUND THEN
		RETURN false; -- admitted or gone meanwhile
	END IF;
	UPDATE pgcoord.quotas q SET waiting = q.waiting - 1 WHERE q.key = ANY (v_keys);
	PERFORM pgcoord.waiters_admit(v_keys);
	RETURN true;
END $$;

-- permit.claim with wait_ms > 0 for the caller p_uid: an immediate claim
-- (permit_claim_as) first; when it is denied, the claim queues and
-- the hand-over runs at once (room may have come between the denial and
-- the queue's lock). Answers a pgcoord.claim_decision (0004_permits.sql):
-- permit_claim's, or queued (position, queued_at, deadline_at;
-- owner_session is the session that queued it); raises permit_claim's
-- refusals, and PCCFL for a retry of a queued id with other quotas.
CREATE FUNCTION pgcoord.permit_wait(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text, p_wait_ms integer)
RETURNS pgcoord.claim_decision
LANGUAGE plpgsql AS $$
DECLARE
	v_w pgcoord.waiters;
	v_c pgcoord.claim_decision;
	v_d pgcoord.claim_decision;
	v_seq bigint;
BEGIN
	-- a retry of a queued id answers where it stands; its wait_ms stands
	SELECT * INTO v_w FROM pgcoord.waiters w WHERE w.id = p_id AND w.state = 'queued';
	IF FOUND AND (v_w.keys <> p_keys OR v_w.weights <> p_weights) THEN
		-- a read only so far: the refusal loses nothing
		RAISE EXCEPTION 'permit "%" already exists with other quotas (%); one id names one '
			'claim', p_id, (SELECT string_agg(t.k || ':' || t.w, ',' ORDER BY t.k)
				       FROM unnest(v_w.keys, v_w.weights) AS t(k, w))
			USING ERRCODE = 'PCCFL';
	END IF;
	IF NOT FOUND THEN
		v_c := pgcoord.permit_claim_as(p_uid, p_admin, p_id, p_keys, p_weights,
			p_session, p_replica, p_on_owner_loss, p_intent, p_limit, p_actor);
		IF v_c.status <> 'denied' THEN
			RETURN v_c;
		END IF;
		PERFORM 1 FROM pgcoord.quotas q WHERE q.key = ANY (p_keys) ORDER BY q.key
		FOR NO KEY UPDATE;
		INSERT INTO pgcoord.waiters AS w (id, uid, session, replica, keys, weights, intent,
			on_owner_loss, actor, deadline_at)
		VALUES (p_id, p_uid, p_session, p_replica, p_keys, p_weights, p_intent,
			p_on_owner_loss, p_actor, now() + pgcoord.ms_interval(p_wait_ms))
		ON CONFLICT (id) WHERE state = 'queued' DO NOTHING
		RETURNING w.seq INTO v_seq;
		IF v_seq IS NULL THEN
			-- the same id queued by a concurrent call: answer as a retry
			RETURN pgcoord.permit_wait(p_uid, p_admin, p_id, p_keys, p_weights, p_session,
				p_replica, p_on_owner_loss, p_intent, p_limit, p_actor, p_wait_ms);
		END IF;
		UPDATE pgcoord.quotas q SET waiting = q.waiting + 1 WHERE q.key = ANY (p_keys);
		PERFORM pgcoord.waiters_admit(p_keys);
		SELECT * INTO v_w FROM pgcoord.waiters w WHERE w.seq = v_seq;
	END IF;
	v_d.now_at := pgcoord.ms(now());
	IF v_w.state = 'admitted' THEN
		-- admitted at once: the reply tells it, no notification follows
		DELETE FROM pgcoord.waiters w WHERE w.seq = v_seq;
		SELECT 'admitted', p.token, p.state, p.phase, p.owner_session, p.owner_replica,
			pgcoord.ms(p.created_at)
		INTO v_d.status, v_d.token, v_d.state, v_d.phase, v_d.owner_session,
			v_d.owner_replica, v_d.created_at
		FROM pgcoord.permits p WHERE p.id = p_id;
		RETURN v_d;
	END IF;
	v_d.status := 'queued';
	v_d.owner_session := v_w.session;
	v_d.owner_replica := v_w.replica;
	v_d."position" := pgcoord.waiter_position(v_w.seq);
	v_d.queued_at := pgcoord.ms(v_w.queued_at);
	v_d.deadline_at := pgcoord.ms(v_w.deadline_at);
	RETURN v_d;
END $$;

-- permit.cancel: the owner session takes its claim out of the queue (an
-- admin may take anyone's: the owner is then told `permit.expired`,
-- reason "cancelled"). Answers cancelled, or the permit's state when it is
-- no longer queued (held, released). Refusals raise before any write
-- (waiter_leave writes only when it answers true): PCFBD another
-- session's waiter or another uid's permit, PCNFD neither exists.
CREATE TYPE pgcoord.cancel_status AS ENUM ('cancelled', 'held', 'released');
CREATE TYPE pgcoord.cancel_decision AS (status pgcoord.cancel_status, now_at bigint);

CREATE FUNCTION pgcoord.permit_cancel(p_uid bigint, p_admin boolean, p_id text,
	p_session bigint)
RETURNS pgcoord.cancel_decision
LANGUAGE plpgsql AS $$
DECLARE
	v_w pgcoord.waiters;
	v_state text;
BEGIN
	SELECT * INTO v_w FROM pgcoord.waiters w WHERE w.id = p_id AND w.state = 'queued';
	IF FOUND THEN
		IF v_w.session <> p_session AND NOT p_admin THEN
			RAISE EXCEPTION 'cannot cancel "%": it was queued by session %; only the '
				'session that queued it (or an admin) may', p_id, v_w.session
				USING ERRCODE = 'PCFBD';
		END IF;
		IF pgcoord.waiter_leave(v_w.seq,
			CASE WHEN v_w.session <> p_session THEN 'expired' END, 'cancelled') THEN
			RETURN ('cancelled', pgcoord.ms(now()))::pgcoord.cancel_decision;
		END IF;
	END IF;
	SELECT p.state INTO v_state FROM pgcoord.permits p WHERE p.id = p_id;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no queued claim or permit "%"', p_id USING ERRCODE = 'PCNFD';
	END IF;
	IF NOT p_admin AND pgcoord.session_owner_uid((SELECT p.owner_session FROM pgcoord.permits p
						     WHERE p.id = p_id)) IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION 'cannot cancel "%": it belongs to another uid; only the session that '
			'queued it (or an admin) may', p_id USING ERRCODE = 'PCFBD';
	END IF;
	RETURN (CASE WHEN v_state = 'released' THEN 'released' ELSE 'held' END::pgcoord.cancel_status,
		pgcoord.ms(now()))::pgcoord.cancel_decision;
END $$;

-- The poll of one agent, once per wait_poll_ms while it has waiters: its
-- waiters past their deadline expire, then every waiter of its sessions
-- that left the queue is returned (and forgotten) for it to notify.
CREATE FUNCTION pgcoord.waiters_poll(p_replica text)
RETURNS TABLE (id text, session bigint, state text, reason text, token bigint,
	permit_state text, phase text, owner_replica text, created_at bigint, queued_ms bigint,
	now_at bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	v_seq bigint;
BEGIN
	FOR v_seq IN SELECT w.seq FROM pgcoord.waiters w
		     WHERE w.replica = p_replica AND w.state = 'queued' AND w.deadline_at <= now()
		     ORDER BY w.seq
	LOOP
		PERFORM pgcoord.waiter_leave(v_seq, 'expired', 'wait_ms elapsed');
	END LOOP;
	RETURN QUERY
	WITH d AS (DELETE FROM pgcoord.waiters w
		   WHERE w.replica = p_replica AND w.state <> 'queued' RETURNING w.*)
	-- (the permit's columns are domains: RETURN QUERY wants the declared text)
	SELECT d.id::text, d.session, d.state, d.reason, p.token, p.state::text, p.phase::text,
	       p.owner_replica,
	       pgcoord.ms(p.created_at), pgcoord.ms(d.left_at) - pgcoord.ms(d.queued_at),
	       pgcoord.ms(now())
	FROM d LEFT JOIN pgcoord.permits p ON p.id = d.id AND d.state = 'admitted'
	ORDER BY d.seq;
END $$;

SELECT pgcoord.secure_functions();
