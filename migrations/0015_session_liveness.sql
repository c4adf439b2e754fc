-- Session liveness at one row per agent per beat.
--
-- A session used to be renewed by its agent's heartbeat: one UPDATE of
-- its expires_at per session per beat, a HOT update and about 136 bytes of
-- WAL each, so an idle fleet's WAL grew with its sessions. Now a session is
-- either attached to its agent or pinned:
--
-- * attached (expires_at IS NULL): live while it is open and its agent's
--   row (replica_id, incarnation) is not stopped and its expires_at lies
--   ahead of now(). The heartbeat renews that one row, whatever the number
--   of sessions.
-- * pinned (expires_at set): live while it is open and its own expires_at
--   lies ahead of now(), as every session was before.
--
-- The rule is written once, in the view session_liveness (every session
-- with its effective expiry and whether it is live); live_sessions is its
-- live rows, and every function that asks whether a session is live asks
-- live_sessions: session_is_live, session_lock_live, session_resume,
-- agent_register, the claims, record recovery, the janitor.
--
-- A session's row changes only when it opens, closes, resumes, or stops
-- being renewed. The last is a pin: the session gets its own expiry, the
-- agent's expiry at that moment, which is exactly the expires_at the old
-- per-session renewal would have left on it (the last beat that renewed
-- it). A session is pinned when the agent's beat no longer lists it (its
-- keepalive was missed, it is closing), when a beat finds the agent row
-- already lapsed (all its attached sessions are pinned to that past expiry
-- before the row is renewed: a beat never revives a session whose death
-- another replica may have acted on), when a new incarnation registers
-- over a dead predecessor, and when it closes (the trigger
-- sessions_pin_on_close), so a closed row keeps the expiry it had.
--
-- Locks. Whoever needs to see a heartbeat in flight locks the agent row
-- before session rows (the heartbeat's order: it updates the agent row,
-- then pins): record recovery (FOR SHARE, waits), the janitor's expiry
-- (FOR SHARE SKIP LOCKED, passes), agent_stop and agent_register (FOR
-- UPDATE). A write on behalf of a session still takes FOR KEY SHARE on the
-- session row alone (session_lock_live): a pin is a no-key update of that
-- row and never waits for it, and the agent row is not locked by writes.
--
-- Indexes. sessions_attached finds an agent's attached sessions (the
-- heartbeat, the janitor after an agent lapsed); sessions_pinned finds
-- pinned sessions past their expiry. No column a beat changes is indexed:
-- agents.expires_at and heartbeat_at are not, so the beat's one update
-- stays HOT.
--
-- Upgrade. Existing sessions keep their expires_at, so they are pinned and
-- their liveness is unchanged; the first beat of their agent after the
-- upgrade attaches each one it lists (one update per session, once). The
-- logic is in these functions, not in the agent: an agent of the previous
-- version still running calls the same functions with the same arguments
-- and gets this behaviour.

ALTER TABLE pgcoord.sessions ALTER COLUMN expires_at DROP NOT NULL;

CREATE INDEX sessions_attached ON pgcoord.sessions (replica_id, incarnation, id)
	INCLUDE (opened_at) WHERE closed_at IS NULL AND expires_at IS NULL;
CREATE INDEX sessions_pinned ON pgcoord.sessions (expires_at)
	WHERE closed_at IS NULL AND expires_at IS NOT NULL;

-- The liveness rule, the one place it is written. expires_at is the
-- session's effective expiry: its own when pinned, its agent's when
-- attached (NULL when attached to an agent row that stopped or was
-- replaced: dead).
CREATE VIEW pgcoord.session_liveness AS
	SELECT s.id, s.replica_id, s.incarnation, s.name, s.opened_at,
	       coalesce(s.expires_at, a.expires_at) AS expires_at, s.closed_at,
	       s.close_reason, s.internal, s.owner_uid,
	       s.closed_at IS NULL AND coalesce(s.expires_at, a.expires_at) > now() AS live
	FROM pgcoord.sessions s
	LEFT JOIN pgcoord.agents a ON s.expires_at IS NULL AND a.replica_id = s.replica_id
		AND a.incarnation = s.incarnation AND a.stopped_at IS NULL;

-- The live sessions, with their effective expiry; the same columns as
-- before.
CREATE OR REPLACE VIEW pgcoord.live_sessions AS
	SELECT l.id, l.replica_id, l.incarnation, l.name, l.opened_at, l.expires_at,
	       l.closed_at, l.close_reason, l.internal, l.owner_uid
	FROM pgcoord.session_liveness l WHERE l.live;

-- A session that closes while attached keeps the expiry it had then (its
-- agent's), so its row says when it would have lapsed, as before.
CREATE FUNCTION pgcoord.sessions_pin_on_close() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	NEW.expires_at := coalesce((SELECT l.expires_at FROM pgcoord.session_liveness l
				    WHERE l.id = OLD.id), now());
	RETURN NEW;
END $$;

CREATE TRIGGER sessions_pin_on_close BEFORE UPDATE OF closed_at ON pgcoord.sessions
	FOR EACH ROW
	WHEN (OLD.closed_at IS NULL AND NEW.closed_at IS NOT NULL AND NEW.expires_at IS NULL)
	EXECUTE FUNCTION pgcoord.sessions_pin_on_close();

-- What a session being attached now gets as expires_at: NULL (attached)
-- while the agent row is live; when it has lapsed (a frozen agent, a
-- database outage), a pinned ttl of its own, as the per-session renewal
-- gave it, so it is neither dead at birth nor kept alive by the row.
CREATE FUNCTION pgcoord.session_attach_expiry(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM pgcoord.agents a
		   WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
		     AND a.stopped_at IS NULL AND a.expires_at > now()) THEN
		RETURN NULL;
	END IF;
	RETURN now() + pgcoord.ms_interval(p_ttl_ms);
END $$;

CREATE OR REPLACE FUNCTION pgcoord.session_is_live(p_session bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
	RETURN EXISTS (SELECT 1 FROM pgcoord.live_sessions l WHERE l.id = p_session);
END $$;

-- As before (see 0002): FOR KEY SHARE on the session row, which every
-- close locks FOR UPDATE first. The agent row is read, not locked: a beat
-- only extends it, and what ends an attached session by time (its agent
-- lapsing) is judged by whoever closes it, under its own locks.
CREATE OR REPLACE FUNCTION pgcoord.session_lock_live(p_session bigint) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.id = p_session AND s.closed_at IS NULL
	  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
	FOR KEY SHARE OF s;
	RETURN FOUND;
END $$;

-- The heartbeat: renews the agent row, the one write of a beat in the
-- steady state. Then the sessions the beat does not list are pinned to
-- the row's expiry before this renewal (the one they had; only those
-- opened before the previous beat, which the agent knew of when it made
-- its list: a session resumed or opened since is attached again by the
-- next beat if it was pinned), and so are all
-- attached sessions if that expiry had already passed: a session that
-- lapsed is never revived, another replica may have acted on its death,
-- so it is reported lost instead. Listed sessions that are pinned but
-- still live by their own expiry (taken over from a predecessor, resumed
-- while the row had lapsed) are attached again. lost: the listed sessions
-- that are not attached live to this incarnation after the beat. The sets
-- are hashed differences, O(n) in the agent's sessions.
CREATE OR REPLACE FUNCTION pgcoord.agent_heartbeat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[])
RETURNS pgcoord.heartbeat_result
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.heartbeat_result;
	v_prev timestamptz;
	v_prev_beat timestamptz;
	v_attached bigint[];
	v_known bigint[];
	v_gone bigint[];
	v_back bigint[];
	v_renewed bigint[];
BEGIN
	-- o is read in the statement's snapshot: the row before this update
	UPDATE pgcoord.agents a SET heartbeat_at = now(),
		expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	FROM (SELECT x.expires_at, x.heartbeat_at FROM pgcoord.agents x
	      WHERE x.replica_id = p_replica_id) o
	WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
	  AND a.stopped_at IS NULL
	RETURNING o.expires_at, o.heartbeat_at INTO v_prev, v_prev_beat;
	IF NOT FOUND THEN
		v_result := ROW(false, ARRAY(SELECT DISTINCT unnest(p_sessions)),
			pgcoord.ms(now()));
		RETURN v_result;
	END IF;
	-- a new statement: sees what a janitor or recovery that held the row
	-- before us committed
	-- v_known: the attached sessions opened before the previous beat,
	-- which the agent knew of when it listed this one; a younger one may
	-- have opened after the list was made, and is not taken for gone
	SELECT coalesce(array_agg(s.id), '{}'),
	       coalesce(array_agg(s.id) FILTER (WHERE s.opened_at < v_prev_beat), '{}')
	INTO v_attached, v_known
	FROM pgcoord.sessions s
	WHERE s.replica_id = p_replica_id AND s.incarnation = p_incarnation
	  AND s.closed_at IS NULL AND s.expires_at IS NULL;
	IF v_prev <= now() THEN
		v_gone := v_attached;
	ELSE
		v_gone := ARRAY(SELECT unnest(v_known) EXCEPT SELECT unnest(p_sessions));
	END IF;
	IF cardinality(v_gone) > 0 THEN
		UPDATE pgcoord.sessions s SET expires_at = v_prev
		WHERE s.id = ANY (v_gone) AND s.closed_at IS NULL AND s.expires_at IS NULL;
		v_attached := ARRAY(SELECT unnest(v_attached) EXCEPT SELECT unnest(v_gone));
	END IF;
	v_back := ARRAY(SELECT unnest(p_sessions) EXCEPT SELECT unnest(v_attached));
	IF cardinality(v_back) > 0 THEN
		WITH r AS (
			UPDATE pgcoord.sessions s SET expires_at = NULL
			WHERE s.id = ANY (v_back) AND s.replica_id = p_replica_id
			  AND s.incarnation = p_incarnation AND s.closed_at IS NULL
			  AND s.expires_at IS NOT NULL
			  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
			RETURNING s.id)
		SELECT coalesce(array_agg(id), '{}') INTO v_renewed FROM r;
		v_back := ARRAY(SELECT unnest(v_back) EXCEPT SELECT unnest(v_renewed));
	END IF;
	v_result := ROW(true, v_back, pgcoord.ms(now()));
	RETURN v_result;
END $$;

-- As before (0002), attached from the start.
CREATE OR REPLACE FUNCTION pgcoord.session_open(p_replica_id text, p_incarnation bigint,
	p_name text, p_ttl_ms bigint, p_internal boolean, p_owner_uid bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	v_id bigint;
BEGIN
	INSERT INTO pgcoord.sessions (replica_id, incarnation, name, expires_at, internal,
		owner_uid)
	SELECT p_replica_id, p_incarnation, p_name,
	       pgcoord.session_attach_expiry(p_replica_id, p_incarnation, p_ttl_ms),
	       p_internal, p_owner_uid
	WHERE EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING id INTO v_id;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'incarnation % of agent % is no longer current; it is stopping',
			p_incarnation, p_replica_id
		USING ERRCODE = 'PCSUP';
	END IF;
	RETURN v_id;
END $$;

-- As before (0002): a live session is re-attached to this incarnation.
CREATE OR REPLACE FUNCTION pgcoord.session_resume(p_id bigint, p_replica_id text,
	p_incarnation bigint, p_ttl_ms bigint, p_uid bigint, p_admin boolean)
RETURNS pgcoord.session_resumption
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.session_resumption;
	v_owner bigint;
BEGIN
	SELECT l.owner_uid INTO v_owner FROM pgcoord.live_sessions l
	WHERE l.id = p_id AND l.replica_id = p_replica_id AND NOT l.internal;
	-- owner_uid never changes, so this check cannot go stale
	IF FOUND AND NOT p_admin AND v_owner IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION 'session % belongs to %; resuming another uid''s session needs '
			'admin', p_id, coalesce('uid ' || v_owner, 'no recorded uid')
		USING ERRCODE = 'PCFBD';
	END IF;
	UPDATE pgcoord.sessions s
	SET incarnation = p_incarnation,
	    expires_at = pgcoord.session_attach_expiry(p_replica_id, p_incarnation, p_ttl_ms)
	WHERE s.id = p_id AND s.replica_id = p_replica_id AND NOT s.internal
	  AND s.closed_at IS NULL
	  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
	  AND EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING s.id, s.name, s.owner_uid INTO v_result;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'session % is no longer live; open a new one', p_id
		USING ERRCODE = 'PCSEX';
	END IF;
	RETURN v_result;
END $$;

-- As before (0002), with the holder locked first and the sessions judged
-- while its row is still the one the rule reads: attached sessions that
-- are not live (the holder lapsed or stopped) are pinned to the expiry
-- they had, so the new row never revives them and the janitor closes them
-- through the session-end hook; live client sessions move to this
-- incarnation and stay attached (live while its row is) or pinned, for
-- their resume grace.
CREATE OR REPLACE FUNCTION pgcoord.agent_register(p_replica_id text, p_incarnation bigint,
	p_host text, p_pid integer, p_version text, p_ttl_ms bigint, p_takeover bigint)
RETURNS pgcoord.agent_claim_result
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.agent_claim_result;
	v_holder pgcoord.agents;
	v_new boolean := false;
	v_taken bigint[];
	v_dead bigint[];
BEGIN
	SELECT a.* INTO v_holder FROM pgcoord.agents a WHERE a.replica_id = p_replica_id
	FOR UPDATE;
	IF NOT FOUND THEN
		INSERT INTO pgcoord.agents (replica_id, incarnation, host, pid, version, expires_at)
		VALUES (p_replica_id, p_incarnation, p_host, p_pid, p_version,
			now() + pgcoord.ms_interval(p_ttl_ms))
		ON CONFLICT (replica_id) DO NOTHING;
		v_new := FOUND;
		IF NOT v_new THEN
			-- a registration that raced us inserted it first
			SELECT a.* INTO v_holder FROM pgcoord.agents a
			WHERE a.replica_id = p_replica_id FOR UPDATE;
		END IF;
	END IF;
	IF NOT v_new AND v_holder.stopped_at IS NULL AND v_holder.expires_at > now()
	   AND v_holder.incarnation <> p_incarnation
	   AND v_holder.incarnation IS DISTINCT FROM p_takeover THEN
		v_result.ok := false;
		v_result.holder_host := v_holder.host;
		v_result.holder_pid := v_holder.pid;
		v_result.holder_incarnation := v_holder.incarnation;
		v_result.holder_expires_in_ms := pgcoord.ms(v_holder.expires_at) - pgcoord.ms(now());
		RETURN v_result;
	END IF;
	UPDATE pgcoord.sessions s SET expires_at = coalesce(l.expires_at, now())
	FROM pgcoord.session_liveness l
	WHERE l.id = s.id AND s.replica_id = p_replica_id AND s.closed_at IS NULL
	  AND s.expires_at IS NULL AND NOT l.live;
	WITH moved AS (
		UPDATE pgcoord.sessions s SET incarnation = p_incarnation
		WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
		  AND s.closed_at IS NULL AND NOT s.internal
		  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_taken FROM moved;
	IF NOT v_new THEN
		UPDATE pgcoord.agents a
		SET incarnation = p_incarnation, host = p_host, pid = p_pid, version = p_version,
		    started_at = now(), heartbeat_at = now(),
		    expires_at = now() + pgcoord.ms_interval(p_ttl_ms), stopped_at = NULL
		WHERE a.replica_id = p_replica_id;
	END IF;
	-- The predecessor's own session died with it (nobody can resume it):
	-- close it now so its janitor lease is handed back at once. Locked FOR
	-- UPDATE first, like every close (see session_lock_live).
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
	  AND s.closed_at IS NULL AND s.internal
	ORDER BY s.id FOR UPDATE;
	WITH dead AS (
		UPDATE pgcoord.sessions s SET closed_at = now(),
			close_reason = 'its agent was replaced by a new incarnation'
		WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
		  AND s.closed_at IS NULL AND s.internal
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_dead FROM dead;
	IF cardinality(v_dead) > 0 THEN
		PERFORM pgcoord.on_sessions_ended(v_dead, 'its agent was replaced', 'ended');
	END IF;
	v_result := ROW(true, p_host, p_pid, p_incarnation, p_ttl_ms, v_taken);
	RETURN v_result;
END $$;

-- As before (0008), with the agent row locked first (agents before
-- sessions, the heartbeat's order: a beat in flight pins sessions after
-- it updated the row).
CREATE OR REPLACE FUNCTION pgcoord.agent_stop(p_replica_id text, p_incarnation bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	v_closed bigint[];
BEGIN
	PERFORM 1 FROM pgcoord.agents a
	WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
	FOR NO KEY UPDATE;
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.replica_id = p_replica_id AND s.incarnation = p_incarnation
	  AND s.closed_at IS NULL
	ORDER BY s.id FOR UPDATE;
	WITH c AS (
		UPDATE pgcoord.sessions SET closed_at = now(), close_reason = 'agent stopped'
		WHERE replica_id = p_replica_id AND incarnation = p_incarnation
		  AND closed_at IS NULL
		RETURNING id)
	SELECT coalesce(array_agg(id), '{}') INTO v_closed FROM c;
	PERFORM pgcoord.on_sessions_ended(v_closed, 'agent stopped', 'ended');
	UPDATE pgcoord.agents SET stopped_at = now()
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation;
	RETURN cardinality(v_closed);
END $$;

-- The janitor's sweep of sessions (0008), from two indexes instead of
-- every open session: pinned sessions past their own expiry
-- (sessions_pinned, oldest first), then attached sessions of agent rows
-- that lapsed or stopped (the agents table, one row per replica, then
-- sessions_attached). An agent row a heartbeat holds is passed over (FOR
-- SHARE SKIP LOCKED), as a session row the heartbeat was renewing was:
-- the beat renews it, or pins its sessions itself. Each is closed as
-- 'lapsed' exactly as before; the trigger pins its expiry.
CREATE OR REPLACE FUNCTION pgcoord.janitor_expire_sessions(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	v_cand bigint[];
	v_ids bigint[];
BEGIN
	v_cand := ARRAY(SELECT s.id FROM pgcoord.sessions s
			WHERE s.closed_at IS NULL AND s.expires_at <= now()
			ORDER BY s.expires_at LIMIT p_limit
			FOR UPDATE SKIP LOCKED);
	IF cardinality(v_cand) < p_limit THEN
		v_cand := v_cand || ARRAY(
			SELECT s.id FROM pgcoord.agents a
			JOIN pgcoord.sessions s ON s.replica_id = a.replica_id
			  AND s.incarnation = a.incarnation
			  AND s.closed_at IS NULL AND s.expires_at IS NULL
			WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now()
			LIMIT p_limit - cardinality(v_cand)
			FOR UPDATE OF s SKIP LOCKED FOR SHARE OF a SKIP LOCKED);
	END IF;
	IF cardinality(v_cand) = 0 THEN
		RETURN 0;
	END IF;
	WITH c AS (
		UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = 'expired'
		WHERE s.id = ANY (v_cand) AND s.closed_at IS NULL
		  AND NOT EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
		RETURNING s.id)
	SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ids FROM c;
	PERFORM pgcoord.on_sessions_ended(v_ids, 'owner session expired', 'lapsed');
	RETURN cardinality(v_ids);
END $$;

-- permit_claim_as, as in 0010_claim_owner.sql, but with liveness read from live_sessions.
CREATE OR REPLACE FUNCTION pgcoord.permit_claim_as(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text)
RETURNS pgcoord.claim_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_d pgcoord.claim_decision;
	v_p pgcoord.permits;
	v_n integer := cardinality(p_keys);
	v_limit integer := p_limit;
	v_inserted boolean := false;
	v_denied integer; -- the subscript of the first key without room
	v_denied_limit integer;
	v_denied_in_flight bigint;
	v_quotas text;
	v_owner_uid bigint;
	j integer;
BEGIN
	IF v_limit IS NOT NULL AND NOT p_admin THEN
		IF EXISTS (SELECT 1 FROM pgcoord.quotas q WHERE q.key = p_keys[1]) THEN
			v_limit := NULL;
		END IF;
	END IF;
	IF v_n IS NULL OR v_n <> cardinality(p_weights)
	   OR (v_limit IS NOT NULL AND v_n <> 1) THEN
		RAISE EXCEPTION 'keys must be distinct and sorted; a limit needs exactly one quota'
			USING ERRCODE = 'PCINV';
	END IF;
	-- one key in a plain one-dimensional array is sorted and distinct
	IF v_n > 1 OR array_ndims(p_keys) <> 1 OR array_lower(p_keys, 1) <> 1 THEN
		IF p_keys <> ARRAY(SELECT DISTINCT k COLLATE "C" FROM unnest(p_keys) AS k ORDER BY 1)
		THEN
			RAISE EXCEPTION 'keys must be distinct and sorted; a limit needs exactly one '
				'quota' USING ERRCODE = 'PCINV';
		END IF;
	END IF;
	-- the weights by the keys' subscripts (1..v_n), as unnest pairs them
	IF array_ndims(p_weights) <> 1 OR array_lower(p_weights, 1) <> 1 THEN
		p_weights := ARRAY(SELECT unnest(p_weights));
	END IF;
	-- The presence guard (guarantee 3): the permit row goes in first. A
	-- duplicate that races us waits here on our insert and then finds the
	-- row (or, if we were denied, its absence), so a lost-reply retry or a
	-- double delivery can never reach the counters a second time. The
	-- session row is locked first, by the same statement (its FOR KEY
	-- SHARE is taken before the insert runs: a lock, not a write, so a
	-- refusal loses nothing, session_lock_live): no session row, no insert.
	INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
		phase, on_owner_loss, intent, quota_key, quota_weight)
	SELECT p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
		'reserved', p_on_owner_loss, p_intent, CASE WHEN v_n = 1 THEN p_keys[1] END,
		CASE WHEN v_n = 1 THEN p_weights[1] END
	FROM pgcoord.sessions s
	WHERE s.id = p_session AND s.closed_at IS NULL
	  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
	FOR KEY SHARE OF s
	ON CONFLICT (id) DO NOTHING
	RETURNING * INTO v_p;
	v_inserted := FOUND;
	IF NOT v_inserted THEN
		-- no row: the session is not live, or the id exists; the
		-- session is refused first, as before any other answer
		PERFORM 1 FROM pgcoord.sessions s
		WHERE s.id = p_session AND s.closed_at IS NULL
		  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
		FOR KEY SHARE;
		IF NOT FOUND THEN
			RAISE EXCEPTION USING ERRCODE = 'PCSEX',
				MESSAGE = pgcoord.claim_session_expired();
		END IF;
	END IF;
	IF NOT v_inserted AND p_uid IS NOT NULL THEN
		-- the id exists: another uid's retirement of it goes, and the
		-- insert runs again ("released" said by released_at, the same
		-- test by the CHECK on permits: the predicate of
		-- permits_released_at is not implied by it, so no plan can walk
		-- every tombstone of that partial index filtering on the id, as
		-- the one made on a fresh install's empty tables did until an
		-- analyze; permits_pkey answers it by id)
		DELETE FROM pgcoord.permits p
		WHERE p.id = p_id AND p.released_at IS NOT NULL AND p.quota_key IS NULL
		  AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_quotas_multi pq
				  WHERE pq.permit_id = p.id)
		  AND (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = p.owner_session)
			IS DISTINCT FROM p_uid;
		IF FOUND THEN
			-- a refusal below rolls the tombstone's delete back with it
			DELETE FROM pgcoord.permit_events e WHERE e.permit_id = p_id;
			INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica,
				state, phase, on_owner_loss, intent, quota_key, quota_weight)
			VALUES (p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
				'reserved', p_on_owner_loss, p_intent,
				CASE WHEN v_n = 1 THEN p_keys[1] END,
				CASE WHEN v_n = 1 THEN p_weights[1] END)
			ON CONFLICT (id) DO NOTHING
			RETURNING * INTO v_p;
			v_inserted := FOUND;
		END IF;
	END IF;
	IF v_inserted THEN
		-- the per-call limit applies to this very admission, and stays
		-- recorded if the claim is denied: it is the caller's current
		-- word on the quota, not part of the grant. A retry of an
		-- existing id changes nothing, limit included.
		IF v_limit IS NOT NULL THEN
			PERFORM pgcoord.quota_apply(p_keys[1], v_limit, NULL, p_actor,
				'claim ' || p_id);
		END IF;
		-- Guarantee 1: one conditional UPDATE per quota, in key order
		-- (the keys are sorted); Postgres re-checks the predicate on the
		-- latest row version under the row lock, so admissions on one
		-- quota serialize and never overshoot, on any agent. One quota:
		-- its UPDATE and its audit row are one statement (its share is in
		-- the permit row); a denial inserts no audit row.
		IF v_n = 1 THEN
			WITH u AS (
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[1]
				WHERE q.key = p_keys[1] AND q.in_flight + p_weights[1] <= q."limit"
				  AND q.waiting = 0
				RETURNING q.key)
			INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, p_keys[1], p_weights[1], 'admitted', p_actor, 'held',
				'reserved'
			FROM u;
			IF NOT FOUND THEN
				v_denied := 1;
				SELECT q."limit", q.in_flight INTO v_denied_limit, v_denied_in_flight
				FROM pgcoord.quotas q WHERE q.key = p_keys[1];
			END IF;
		ELSE
			FOR j IN 1 .. v_n LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[j]
				WHERE q.key = p_keys[j] AND q.in_flight + p_weights[j] <= q."limit"
				  AND q.waiting = 0;
				IF NOT FOUND THEN
					v_denied := j;
					SELECT q."limit", q.in_flight
					INTO v_denied_limit, v_denied_in_flight
					FROM pgcoord.quotas q WHERE q.key = p_keys[j];
					EXIT;
				END IF;
			END LOOP;
		END IF;
		IF v_denied IS NOT NULL THEN
			-- all or nothing: give back the keys before the refusing
			-- one (still locked by us) and take the permit row out
			FOR j IN 1 .. v_denied - 1 LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight - p_weights[j]
				WHERE q.key = p_keys[j];
			END LOOP;
			DELETE FROM pgcoord.permits p WHERE p.id = p_id AND p.token = v_p.token;
			v_inserted := false;
		ELSIF v_n > 1 THEN
			-- the shares (of two or more quotas) and the audit rows in
			-- one statement
			WITH shares AS (
				INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
				SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w))
			INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, t.k, t.w, 'admitted', p_actor, 'held', 'reserved'
			FROM unnest(p_keys, p_weights) AS t(k, w) ORDER BY t.k COLLATE "C";
		END IF;
	END IF;

	-- ms(), written out
	v_d.now_at := (extract(epoch FROM now()) * 1000)::bigint;
	IF v_denied IS NOT NULL THEN
		v_d.status := CASE WHEN v_denied_limit IS NULL THEN 'unknown_quota'
			      ELSE 'denied' END::pgcoord.claim_status;
		v_d.denied_key := p_keys[v_denied];
		v_d.denied_limit := v_denied_limit;
		v_d.denied_in_flight := v_denied_in_flight;
		RETURN v_d;
	END IF;
	IF v_inserted THEN
		v_d.status := 'admitted';
		v_d.token := v_p.token;
		v_d.state := v_p.state;
		v_d.phase := v_p.phase;
		v_d.owner_session := v_p.owner_session;
		v_d.owner_replica := v_p.owner_replica;
		v_d.created_at := (extract(epoch FROM v_p.created_at) * 1000)::bigint;
		RETURN v_d;
	END IF;

	-- The id exists (committed: ON CONFLICT waited for its inserter, and
	-- inserted nothing): a refusal from here on writes nothing before it.
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id;
	-- the owner's uid comes with the quotas, in the same statement: a
	-- retry costs no statement more than it did
	SELECT string_agg(pq.key || ':' || pq.weight, ',' ORDER BY pq.key),
	       (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = v_p.owner_session)
	INTO v_quotas, v_owner_uid
	FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p_id;
	-- another uid's id (held, uncertain or released; its retirement went
	-- above), also for an admin: refused before any answer that would
	-- tell its state, quotas or grant (see the top of this file)
	IF p_uid IS NOT NULL AND v_owner_uid IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION USING ERRCODE = 'PCCFL', MESSAGE = pgcoord.claim_id_taken(p_id);
	END IF;
	IF v_p.state = 'released' AND v_quotas IS NULL THEN
		-- a tombstone without quotas: a release retired the id unclaimed
		RAISE EXCEPTION 'permit id "%" was retired at % (ms, database clock) by a release '
			'before any claim of it committed; an id is granted at most once: claim with '
			'a new id', p_id, pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_p.state = 'released' THEN
		RAISE EXCEPTION 'permit "%" was already granted and released at % (ms, database '
			'clock); an id is granted at most once: claim with a new id', p_id,
			pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_quotas IS DISTINCT FROM (SELECT string_agg(t.k || ':' || t.w, ',' ORDER BY t.k COLLATE "C")
				      FROM unnest(p_keys, p_weights) AS t(k, w)) THEN
		RAISE EXCEPTION 'permit "%" already exists with other quotas (%); one id names one '
			'claim', p_id, v_quotas USING ERRCODE = 'PCCFL';
	END IF;
	SELECT 'held', v_p.token, s.effective_state, v_p.phase, v_p.owner_session,
		v_p.owner_replica, pgcoord.ms(v_p.created_at)
	INTO v_d.status, v_d.token, v_d.state, v_d.phase, v_d.owner_session, v_d.owner_replica,
		v_d.created_at
	FROM pgcoord.permit_status s WHERE s.id = p_id;
	RETURN v_d;
END $$;

-- permit_claim_group, as in 0004_permits.sql, but with liveness read from live_sessions.
CREATE OR REPLACE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[],
	p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[], p_replicas text[],
	p_on_owner_loss text[], p_intents bytea[], p_limits integer[], p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text,
	status pgcoord.claim_status, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, now_at bigint, "position" bigint,
	queued_at bigint, deadline_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
	SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
	v_n integer := coalesce(cardinality(p_ids), 0);
	v_set integer[];     -- members judged in memory, arrival order
	v_alone integer[] := '{}'; -- members judged by permit_claim_as, after
	v_alone_keys text[]; -- the keys those may touch
	v_live bigint[];
	v_dead integer[];
	v_more integer[];
	v_ins_ids text[];
	v_ins_tokens bigint[];
	v_qk text[];
	v_ql integer[];
	v_qf bigint[];
	v_qw integer[];
	v_qd integer[];      -- the net weight admitted on each of v_qk
	v_adm integer[] := '{}';
	v_am integer[] := '{}'; -- the admitted members' shares, flat, in
	v_ak text[] := '{}';    -- admission order then key order: member,
	v_aw integer[] := '{}'; -- key, weight
	v_multi integer[] := '{}'; -- admitted members of two or more quotas
	v_den integer[] := '{}';
	v_den_key text[] := '{}';
	v_den_limit integer[] := '{}';
	v_den_in_flight bigint[] := '{}';
	v_k text[];
	v_w integer[];
	v_dk text;
	v_pos integer;
	v_now bigint;
	i integer;
	j integer;
BEGIN
	IF v_n = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, c.*
		FROM pgcoord.permit_claim_as(p_uids[1], p_admins[1], p_ids[1],
			p_keys[1]::text[], p_weights[1]::integer[], p_sessions[1], p_replicas[1],
			p_on_owner_loss[1], p_intents[1], p_limits[1], p_actors[1]) c;
		RETURN;
	END IF;
	-- The common members, in arrival order (see above). A member's keys or
	-- weights that do not parse as an array fail this statement: then the
	-- whole group goes member by member, each refused alone.
	BEGIN
		v_set := ARRAY(
			SELECT m.i FROM unnest(p_ids, p_keys, p_weights, p_limits, p_on_owner_loss,
					      p_intents, p_actors) WITH ORDINALITY
				AS m(id, k, w, lim, ool, intent, actor, i)
			WHERE m.i <= v_n AND m.lim IS NULL AND octet_length(m.id) BETWEEN 1 AND 200
			  AND m.ool IN ('uncertain', 'release') AND m.actor IS NOT NULL
			  AND coalesce(octet_length(m.intent), 0) <= 65536
			  AND cardinality(m.k::text[]) >= 1
			  AND cardinality(m.k::text[]) = cardinality(m.w::integer[])
			  AND array_position(m.k::text[], NULL) IS NULL
			  -- one key in a plain one-dimensional array is sorted and
			  -- distinct: no sort per member
			  AND (cardinality(m.k::text[]) = 1 AND array_ndims(m.k::text[]) = 1
			       AND array_lower(m.k::text[], 1) = 1
			       OR m.k::text[] = ARRAY(SELECT DISTINCT x COLLATE "C"
						      FROM unnest(m.k::text[]) AS x ORDER BY 1))
			  AND 1 <= ALL (m.w::integer[])
			  -- weights by the keys' subscripts, as the judging below reads them
			  AND array_ndims(m.w::integer[]) = 1 AND array_lower(m.w::integer[], 1) = 1
			  AND (SELECT count(*) FROM unnest(p_ids) AS d WHERE d = m.id) = 1
			  AND NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = m.id)
			ORDER BY m.i);
	EXCEPTION WHEN OTHERS THEN
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
			ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids, p_keys,
			p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
			p_actors);
		RETURN;
	END;

	IF cardinality(v_set) < v_n THEN
		v_alone := ARRAY(SELECT g FROM generate_series(1, v_n) AS g
				 WHERE g <> ALL (v_set) ORDER BY 1);
	END IF;

	-- The session rows, each locked in id order as session_lock_live locks
	-- one (written out: a call per session costs a SECURITY DEFINER frame;
	-- the lateral lookup keeps the generic plan a probe by id per session,
	-- where "id = ANY" let it walk every open session), then the members
	-- split by whether their session is live.
	v_live := ARRAY(
		SELECT l.id FROM (SELECT DISTINCT p_sessions[i] AS id FROM unnest(v_set) AS i
				  WHERE p_sessions[i] IS NOT NULL ORDER BY 1) d
		CROSS JOIN LATERAL (
			SELECT s.id FROM pgcoord.sessions s
			WHERE s.id = d.id AND s.closed_at IS NULL
			  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
			FOR KEY SHARE) l);
	v_more := v_set;
	v_set := '{}';
	v_dead := '{}';
	FOREACH i IN ARRAY v_more LOOP
		IF p_sessions[i] = ANY (v_live) THEN
			v_set := v_set || i;
		ELSE
			v_dead := v_dead || i;
		END IF;
	END LOOP;

	-- the closure: nobody judged in memory shares a quota with a member
	-- judged alone. Only members the statement above could not judge are
	-- alone; their keys may not even parse, which sends the whole group
	-- member by member, as above.
	IF cardinality(v_alone) > 0 THEN
		BEGIN
			v_alone_keys := ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
					      FROM unnest(v_alone) AS i);
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
				ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids,
				p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss,
				p_intents, p_limits, p_actors);
			RETURN;
		END;
		LOOP
			v_more := ARRAY(SELECT i FROM unnest(v_set) AS i
					WHERE p_keys[i]::text[] && v_alone_keys);
			EXIT WHEN cardinality(v_more) = 0;
			v_alone := ARRAY(SELECT unnest(v_alone || v_more) ORDER BY 1);
			v_set := ARRAY(SELECT i FROM unnest(v_set) WITH ORDINALITY AS s(i, o)
				       WHERE i <> ALL (v_more) ORDER BY o);
			v_alone_keys := v_alone_keys
				|| ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
					 FROM unnest(v_more) AS i);
		END LOOP;
	END IF;

	-- the presence guard, and the tokens in arrival order
	WITH ins AS (
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, intent, quota_key, quota_weight)
		SELECT p_ids[s.i], nextval('pgcoord.token_seq'), p_sessions[s.i], p_replicas[s.i],
		       'held', 'reserved', p_on_owner_loss[s.i], p_intents[s.i],
		       -- a member's arrays may start at any subscript: unnest pairs them
		       CASE WHEN cardinality(p_keys[s.i]::text[]) = 1
			    THEN (SELECT a.k FROM unnest(p_keys[s.i]::text[]) AS a(k)) END,
		       CASE WHEN cardinality(p_keys[s.i]::text[]) = 1
			    THEN (SELECT a.w FROM unnest(p_weights[s.i]::integer[]) AS a(w)) END
		FROM (SELECT s.i FROM unnest(v_set) WITH ORDINALITY AS s(i, o) ORDER BY s.o) s
		ON CONFLICT (id) DO NOTHING
		RETURNING p.id, p.token)
	SELECT coalesce(array_agg(ins.id), '{}'), coalesce(array_agg(ins.token), '{}')
	INTO v_ins_ids, v_ins_tokens FROM ins;
	IF cardinality(v_ins_ids) <> cardinality(v_set) THEN
		-- an id claimed meanwhile elsewhere: the whole group alone
		DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ins_ids);
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
			ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids, p_keys,
			p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
			p_actors);
		RETURN;
	END IF;

	SELECT array_agg(q.key ORDER BY q.key), array_agg(q."limit" ORDER BY q.key),
	       array_agg(q.in_flight ORDER BY q.key), array_agg(q.waiting ORDER BY q.key)
	INTO v_qk, v_ql, v_qf, v_qw
	FROM (SELECT q.key, q."limit", q.in_flight, q.waiting FROM pgcoord.quotas q
	      WHERE q.key = ANY (ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
				       FROM unnest(v_set) AS i))
	      ORDER BY q.key FOR NO KEY UPDATE OF q) q;
	v_qd := array_fill(0, ARRAY[coalesce(cardinality(v_qk), 0)]);

	-- judged in arrival order, each against what the ones before it took
	FOREACH i IN ARRAY v_set LOOP
		v_k := p_keys[i]::text[];
		v_w := p_weights[i]::integer[];
		v_dk := NULL;
		FOR j IN 1 .. cardinality(v_k) LOOP
			v_pos := array_position(v_qk, v_k[j]);
			IF v_pos IS NULL OR NOT (v_qf[v_pos] + v_w[j] <= v_ql[v_pos]
						 AND v_qw[v_pos] = 0) THEN
				v_dk := v_k[j];
				EXIT;
			END IF;
		END LOOP;
		IF v_dk IS NULL THEN
			FOR j IN 1 .. cardinality(v_k) LOOP
				v_pos := array_position(v_qk, v_k[j]);
				v_qf[v_pos] := v_qf[v_pos] + v_w[j];
				v_qd[v_pos] := v_qd[v_pos] + v_w[j];
				v_am := v_am || i;
				v_ak := v_ak || v_k[j];
				v_aw := v_aw || v_w[j];
			END LOOP;
			v_adm := v_adm || i;
			IF cardinality(v_k) > 1 THEN
				v_multi := v_multi || i;
			END IF;
		ELSE
			v_den := v_den || i;
			v_den_key := v_den_key || v_dk;
			v_den_limit := v_den_limit || v_ql[v_pos];
			v_den_in_flight := v_den_in_flight || v_qf[v_pos];
		END IF;
	END LOOP;

	IF cardinality(v_den) > 0 THEN
		DELETE FROM pgcoord.permits p
		WHERE p.id = ANY (ARRAY(SELECT p_ids[i] FROM unnest(v_den) AS i));
	END IF;
	-- the counters by the net weights judged above and the audit rows in
	-- one statement, from the shares gathered while judging (no member's
	-- keys parsed again); the shares of permits of two or more quotas (one
	-- is in the permit row) only when there are some
	WITH counters AS (
		UPDATE pgcoord.quotas q
		SET in_flight = q.in_flight + v_qd[array_position(v_qk, q.key::text)]
		WHERE q.key = ANY (v_qk) AND v_qd[array_position(v_qk, q.key::text)] <> 0)
	INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, state, phase)
	SELECT p_ids[a.m], a.k, a.w, 'admitted', p_actors[a.m], 'held', 'reserved'
	FROM unnest(v_am, v_ak, v_aw) WITH ORDINALITY AS a(m, k, w, o)
	ORDER BY a.o;
	IF cardinality(v_multi) > 0 THEN
		INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
		SELECT p_ids[a.m], a.k, a.w FROM unnest(v_am, v_ak, v_aw) AS a(m, k, w)
		WHERE a.m = ANY (v_multi);
	END IF;

	-- ms(now()), written out: once, not a call per member
	v_now := (extract(epoch FROM now()) * 1000)::bigint;
	RETURN QUERY
	SELECT a.i, a.err_state, a.err_message, (a.d).*
	FROM (
	SELECT i, NULL::text AS err_state, NULL::text AS err_message, ('admitted',
	       v_ins_tokens[array_position(v_ins_ids, p_ids[i])], 'held', 'reserved',
	       p_sessions[i], p_replicas[i], v_now, NULL, NULL, NULL, NULL, v_now, NULL, NULL,
	       NULL)::pgcoord.claim_decision
	FROM unnest(v_adm) AS i
	UNION ALL
	SELECT d.i, NULL, NULL, (CASE WHEN d.lim IS NULL THEN 'unknown_quota'
	       ELSE 'denied' END::pgcoord.claim_status,
	       NULL, NULL, NULL, NULL, NULL, NULL, NULL, d.k, d.lim, d.f, v_now, NULL, NULL,
	       NULL)::pgcoord.claim_decision
	FROM unnest(v_den, v_den_key, v_den_limit, v_den_in_flight) AS d(i, k, lim, f)
	UNION ALL
	-- the lone claim's refusal, as a member's error (groups.c answers it)
	SELECT i, 'PCSEX', pgcoord.claim_session_expired(), NULL::pgcoord.claim_decision
	FROM unnest(v_dead) AS i) a(i, err_state, err_message, d);

	IF cardinality(v_alone) > 0 THEN
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(v_alone, p_uids, p_admins,
			p_ids, p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents,
			p_limits, p_actors);
	END IF;
END $$;

-- janitor_lapse_permits, as in 0004_permits.sql, but with liveness read from live_sessions.
CREATE OR REPLACE FUNCTION pgcoord.janitor_lapse_permits(p_limit integer,
	p_actor text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_actor text := coalesce(p_actor, pgcoord.janitor_actor());
	v_sessions bigint[];
	v_cand text[];
	v_locked text[];
	v_n integer := 0;
BEGIN
	-- session_is_live, written out so the planner can join (see above)
	SELECT coalesce(array_agg(DISTINCT p.owner_session), '{}') INTO v_sessions
	FROM (SELECT p.owner_session FROM pgcoord.permits p
	      WHERE p.owner_session IS NOT NULL AND p.state <> 'released'
		AND (p.state = 'held' OR (p.state = 'uncertain' AND p.on_owner_loss = 'release'))
		AND NOT EXISTS (SELECT 1 FROM pgcoord.live_sessions lv
				WHERE lv.id = p.owner_session)
	      LIMIT p_limit) p;
	IF cardinality(v_sessions) > 0 THEN
		v_n := v_n + pgcoord.permits_owner_lost(v_sessions, 'found no longer live by the janitor',
			v_actor);
	END IF;

	SELECT coalesce(array_agg(c.id), '{}') INTO v_cand
	FROM (SELECT p.id FROM pgcoord.permits p
	      WHERE p.state = 'uncertain'
		AND NOT EXISTS (
			SELECT 1 FROM pgcoord.permit_quotas pq
			JOIN pgcoord.quotas q ON q.key = pq.key
			WHERE pq.permit_id = p.id
			  AND (q.lapse_after_s IS NULL
			       OR p.state_at + q.lapse_after_s * interval '1 second' > now()))
	      ORDER BY p.state_at LIMIT p_limit) c;
	IF cardinality(v_cand) = 0 THEN
		RETURN v_n;
	END IF;
	PERFORM pgcoord.permits_lock_quotas(v_cand);
	-- re-checked under the lock: a resolve may have adopted one meanwhile
	SELECT coalesce(array_agg(l.id), '{}') INTO v_locked
	FROM (SELECT p.id FROM pgcoord.permits p
	      WHERE p.id = ANY (v_cand) AND p.state = 'uncertain'
		AND NOT EXISTS (
			SELECT 1 FROM pgcoord.permit_quotas pq
			JOIN pgcoord.quotas q ON q.key = pq.key
			WHERE pq.permit_id = p.id
			  AND (q.lapse_after_s IS NULL
			       OR p.state_at + q.lapse_after_s * interval '1 second' > now()))
	      ORDER BY p.id FOR UPDATE OF p) l;
	v_n := v_n + pgcoord.permits_release_locked(v_locked, 'lapsed', v_actor,
		'uncertain for longer than lapse_after_s');
	RETURN v_n;
END $$;

-- record_recover, as in 0007_records.sql, but with liveness read from live_sessions.
CREATE OR REPLACE FUNCTION pgcoord.record_recover(p_session bigint, p_kinds text[], p_limit integer,
	p_actor text, p_uid bigint, p_max_bytes bigint)
RETURNS SETOF pgcoord.record_recovery
LANGUAGE plpgsql AS $$
DECLARE
	v_replica text;
	v_c_kinds text[];
	v_c_keys text[];
	v_c_owners bigint[];
	v_owners bigint[];
	v_closed bigint[];
	v_dead bigint[];
	v_a_kinds text[];
	v_a_keys text[];
	v_a_from bigint[];
	v_a_permits text[];
	v_left bigint;
	v_remaining bigint;
BEGIN
	IF NOT pgcoord.session_is_live(p_session) THEN
		RAISE EXCEPTION 'session % is no longer live; open a new one to recover', p_session
		USING ERRCODE = 'PCSEX';
	END IF;
	SELECT s.replica_id INTO v_replica FROM pgcoord.sessions s WHERE s.id = p_session;

	-- 1. Candidates: open records whose owner is not live, locked. SKIP
	-- LOCKED passes over rows a concurrent recovery (or their owner) holds:
	-- that one takes them, or they are left for the next call.
	SELECT coalesce(array_agg(c.kind ORDER BY c.kind, c.key), '{}'),
	       coalesce(array_agg(c.key ORDER BY c.kind, c.key), '{}'),
	       coalesce(array_agg(c.owner_session ORDER BY c.kind, c.key), '{}')
	INTO v_c_kinds, v_c_keys, v_c_owners
	FROM (SELECT r.kind, r.key, r.owner_session FROM pgcoord.records r
	      WHERE NOT r.terminal AND (p_kinds IS NULL OR r.kind = ANY (p_kinds))
		AND NOT pgcoord.session_is_live(r.owner_session)
		AND (p_uid IS NULL
		     OR pgcoord.session_owner_uid(r.owner_session) IS NOT DISTINCT FROM p_uid)
	      ORDER BY r.kind, r.key
	      LIMIT p_limit
	      FOR UPDATE OF r SKIP LOCKED) c;

	-- 1b. The reply stays within p_max_bytes: candidates stop once their
	-- data (and an allowance for the other fields and the permit) would
	-- pass it; the first always goes. The others are left, counted in
	-- remaining, for the next call.
	SELECT coalesce(array_agg(t.kind ORDER BY t.ord), '{}'),
	       coalesce(array_agg(t.key ORDER BY t.ord), '{}'),
	       coalesce(array_agg(t.owner ORDER BY t.ord), '{}')
	INTO v_c_kinds, v_c_keys, v_c_owners
	FROM (SELECT c.kind, c.key, c.owner, c.ord,
		     sum(coalesce(octet_length(r.data), 0) + 1536) OVER (ORDER BY c.ord) AS upto
	      FROM unnest(v_c_kinds, v_c_keys, v_c_owners) WITH ORDINALITY AS c(kind, key, owner, ord)
	      JOIN pgcoord.records r ON r.kind = c.kind AND r.key = c.key) t
	WHERE t.upto <= p_max_bytes OR t.ord = 1;

	IF cardinality(v_c_kinds) > 0 THEN
		-- 2. Make each owner's death final before taking its work. A
		-- heartbeat whose transaction began before ours could still renew
		-- the agent row of an owner we saw lapsed. The agent rows of
		-- attached owners are locked first (FOR SHARE waits for a
		-- heartbeat in flight; agents before sessions, the heartbeat's
		-- order), then the session rows in id order, and the owners
		-- still dead are closed: a closed row stays dead whatever its
		-- agent does next. An owner whose agent such a heartbeat renewed
		-- first is live after all and keeps its records.
		v_owners := ARRAY(SELECT DISTINCT o FROM unnest(v_c_owners) AS o ORDER BY o);
		PERFORM 1 FROM pgcoord.agents a
		WHERE (a.replica_id, a.incarnation) IN (
			SELECT s.replica_id, s.incarnation FROM pgcoord.sessions s
			WHERE s.id = ANY (v_owners) AND s.closed_at IS NULL AND s.expires_at IS NULL)
		ORDER BY a.replica_id FOR SHARE OF a;
		PERFORM 1 FROM pgcoord.sessions s WHERE s.id = ANY (v_owners)
		ORDER BY s.id FOR UPDATE;
		WITH c AS (
			UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = 'expired'
			WHERE s.id = ANY (v_owners) AND s.closed_at IS NULL
			  AND NOT EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
			RETURNING s.id)
		SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO v_closed FROM c;
		IF cardinality(v_closed) > 0 THEN
			-- The consequences of a lapsed session's end, exactly as when
			-- the janitor expires it (same reason: the hook treats a
			-- session whose agent stopped heartbeating the same, whoever
			-- closes it). Its permits first, so their audit names this
			-- recovery as the actor; the hook's own pass finds them done.
			PERFORM pgcoord.permits_owner_lost(v_closed,
				'owner session expired (found by record recovery)', p_actor);
			PERFORM pgcoord.on_sessions_ended(v_closed, 'owner session expired', 'lapsed');
		END IF;
		SELECT coalesce(array_agg(s.id), '{}') INTO v_dead FROM pgcoord.sessions s
		WHERE s.id = ANY (v_owners) AND s.closed_at IS NOT NULL;

		-- 3. Adopt: one atomic conditional UPDATE. The predicate (still
		-- owned by the dead owner we saw, still open) is what Postgres
		-- re-checks on the latest row version, so a record is taken once.
		WITH a AS (
			UPDATE pgcoord.records r
			SET owner_session = p_session, owner_replica = v_replica,
			    token = nextval('pgcoord.token_seq'), adopted_from = r.owner_session,
			    adopted_at = now(), updated_at = now()
			FROM unnest(v_c_kinds, v_c_keys, v_c_owners) AS c(kind, key, owner)
			WHERE r.kind = c.kind AND r.key = c.key AND r.owner_session = c.owner
			  AND r.owner_session = ANY (v_dead) AND NOT r.terminal
			RETURNING r.kind, r.key, r.token, r.adopted_from, r.permit_id, r.state),
		e AS (
			INSERT INTO pgcoord.record_events (kind, key, event, actor, from_session,
				to_session, token, state)
			SELECT a.kind, a.key, 'adopt', p_actor, a.adopted_from, p_session, a.token,
			       a.state
			FROM a ORDER BY a.kind, a.key)
		SELECT coalesce(array_agg(a.kind ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.key ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.adopted_from ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.permit_id ORDER BY a.kind, a.key), '{}')
		INTO v_a_kinds, v_a_keys, v_a_from, v_a_permits
		FROM a;

		-- 4. Their permits come along and stay uncertain until the adopter
		-- resolves them with evidence. A dead owner's held permits become
		-- uncertain first (released, for on_owner_loss = release), audited,
		-- exactly as the janitor would do it.
		IF EXISTS (SELECT 1 FROM unnest(v_a_permits) AS x WHERE x IS NOT NULL) THEN
			PERFORM pgcoord.permits_owner_lost(
				ARRAY(SELECT DISTINCT f FROM unnest(v_a_from) AS f),
				'owner session ended (found by record recovery)', p_actor);
			PERFORM 1 FROM pgcoord.permits p WHERE p.id = ANY (v_a_permits)
			ORDER BY p.id FOR UPDATE;
			WITH m AS (
				UPDATE pgcoord.permits p
				SET owner_session = p_session, owner_replica = v_replica
				FROM (SELECT DISTINCT x.id, x.from_session
				      FROM unnest(v_a_permits, v_a_from) AS x(id, from_session)
				      WHERE x.id IS NOT NULL) x
				WHERE p.id = x.id AND p.owner_session = x.from_session
				  AND p.state = 'uncertain'
				RETURNING p.id, p.phase, x.from_session)
			INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state,
				phase)
			SELECT m.id, 'adopted', p_actor,
			       format('record recovery: its record was adopted from dead session %s; '
				      'uncertain until resolved with evidence', m.from_session),
			       'uncertain', m.phase
			FROM m ORDER BY m.id;
		END IF;
	ELSE
		v_a_kinds := '{}';
		v_a_keys := '{}';
	END IF;

	-- 5. What was left: live owners' records and other uids' dead ones
	-- (not the caller's to take), and the dead owners' records of its uid
	-- this call did not take (past the limit, or a concurrent recovery's).
	SELECT count(*) FILTER (WHERE (o.live AND o.owner_session <> p_session)
				   OR (NOT o.live AND NOT o.mine)),
	       count(*) FILTER (WHERE NOT o.live AND o.mine)
	INTO v_left, v_remaining
	FROM (SELECT r.owner_session, pgcoord.session_is_live(r.owner_session) AS live,
		     p_uid IS NULL OR pgcoord.session_owner_uid(r.owner_session)
			IS NOT DISTINCT FROM p_uid AS mine
	      FROM pgcoord.records r
	      WHERE NOT r.terminal AND (p_kinds IS NULL OR r.kind = ANY (p_kinds))) o;

	-- (the permit's columns are domains: RETURN QUERY wants the declared text)
	RETURN QUERY
	SELECT pgcoord.ms(now()), v_left, v_remaining, s.*, p.state::text, p.phase::text,
	       p.token, p.owner_session, p.uncertain_reason
	FROM (SELECT 1) one
	LEFT JOIN (pgcoord.record_status s LEFT JOIN pgcoord.permits p ON p.id = s.permit_id)
	  ON (s.kind, s.key) IN (SELECT * FROM unnest(v_a_kinds, v_a_keys))
	ORDER BY s.kind, s.key;
END $$;

SELECT pgcoord.secure_functions();
