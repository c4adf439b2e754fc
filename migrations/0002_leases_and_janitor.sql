-- Leadership leases (guarantee 7), the one place where a session's end has
-- consequences, and the janitor's sweep.

CREATE TABLE pgcoord.leases (
	name               text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
	holder_session     bigint,          -- NULL while free
	holder_replica     text,
	holder_incarnation bigint,
	-- the fencing token: a fresh value from token_seq at every change of
	-- holder (and when a holder re-acquires after its lease lapsed)
	epoch              bigint NOT NULL,
	ttl_ms             bigint NOT NULL,
	acquired_at        timestamptz,
	renewed_at         timestamptz,
	expires_at         timestamptz NOT NULL
);
CREATE INDEX leases_by_holder ON pgcoord.leases (holder_session) WHERE holder_session IS NOT NULL;

-- Every change of holder, for operators and the soak checker.
CREATE TABLE pgcoord.lease_events (
	id         bigserial PRIMARY KEY,
	name       text NOT NULL,
	epoch      bigint NOT NULL,
	session    bigint,
	replica_id text,
	event      text NOT NULL CHECK (event IN ('acquired', 'released', 'expired')),
	reason     text,
	at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lease_events_by_name ON pgcoord.lease_events (name, id);

CREATE FUNCTION pgcoord.session_is_live(p_session bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
	SELECT EXISTS (SELECT 1 FROM pgcoord.sessions s
		       WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now())
$$;

-- Liveness for a write on behalf of p_session: the row is read under FOR
-- KEY SHARE, and every path that ends a session locks its row FOR UPDATE
-- first, so a concurrent close (agent stop, session.close, grace end,
-- expiry, recovery) either commits first and is seen here, or waits until
-- this transaction committed and then applies its consequences to what it
-- wrote. Without the lock a close could slip between the check and the
-- write, leaving a lease, permit or record taken by a session already
-- closed. KEY SHARE and not SHARE: the heartbeat's renewal (a plain UPDATE
-- of expires_at, which only ever extends liveness) must not wait for a
-- write that is itself waiting, say a claim queued on a quota row someone
-- holds; with SHARE, one such claim stalled the agent's heartbeat until
-- every session of the agent was declared lost. Session rows are always
-- locked before lease, quota, permit or record rows.
CREATE FUNCTION pgcoord.session_lock_live(p_session bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now()
	FOR KEY SHARE;
	RETURN FOUND;
END $$;

-- Acquires or renews, in one atomic upsert. The WHERE admits only the
-- current holder or a free/expired row, judged by the database clock, so
-- two agents' clocks can never elect two leaders. A session that is not
-- live cannot acquire (checked under the session row's lock).
CREATE FUNCTION pgcoord.lease_acquire(p_name text, p_session bigint, p_replica text,
	p_incarnation bigint, p_ttl_ms bigint)
RETURNS TABLE (leader boolean, epoch bigint, holder_session bigint, holder_replica text,
	expires_in_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_epoch bigint;
	v_prev_epoch bigint;
	v_prev_session bigint;
	v_prev_expires timestamptz;
BEGIN
	IF NOT pgcoord.session_lock_live(p_session) THEN
		RETURN QUERY SELECT false, l.epoch, l.holder_session, l.holder_replica,
			greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
		FROM pgcoord.leases l WHERE l.name = p_name;
		RETURN;
	END IF;
	-- lock first, so the previous holder we record is the one we replace
	SELECT l.epoch, l.holder_session, l.expires_at
	INTO v_prev_epoch, v_prev_session, v_prev_expires
	FROM pgcoord.leases l WHERE l.name = p_name FOR UPDATE;
	-- held by someone else: answer without drawing a token, so campaigns
	-- do not burn through the sequence
	IF FOUND AND v_prev_session IS DISTINCT FROM p_session AND v_prev_session IS NOT NULL
	   AND v_prev_expires > now() THEN
		RETURN QUERY SELECT false, v_prev_epoch, v_prev_session, l.holder_replica,
			pgcoord.ms(v_prev_expires) - pgcoord.ms(now())
		FROM pgcoord.leases l WHERE l.name = p_name;
		RETURN;
	END IF;

	INSERT INTO pgcoord.leases AS l (name, holder_session, holder_replica,
		holder_incarnation, epoch, ttl_ms, acquired_at, renewed_at, expires_at)
	VALUES (p_name, p_session, p_replica, p_incarnation, nextval('pgcoord.token_seq'),
		p_ttl_ms, now(), now(), now() + pgcoord.ms_interval(p_ttl_ms))
	ON CONFLICT (name) DO UPDATE
	SET epoch = CASE WHEN l.holder_session = p_session AND l.expires_at > now()
			 THEN l.epoch ELSE nextval('pgcoord.token_seq') END,
	    acquired_at = CASE WHEN l.holder_session = p_session AND l.expires_at > now()
			       THEN l.acquired_at ELSE now() END,
	    holder_session = p_session, holder_replica = p_replica,
	    holder_incarnation = p_incarnation, ttl_ms = p_ttl_ms, renewed_at = now(),
	    expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	WHERE l.holder_session = p_session OR l.holder_session IS NULL OR l.expires_at <= now()
	RETURNING l.epoch INTO v_epoch;

	IF v_epoch IS NULL THEN
		RETURN QUERY SELECT false, l.epoch, l.holder_session, l.holder_replica,
			greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
		FROM pgcoord.leases l WHERE l.name = p_name;
		RETURN;
	END IF;
	IF v_prev_epoch IS DISTINCT FROM v_epoch THEN
		IF v_prev_session IS NOT NULL AND v_prev_session <> p_session THEN
			INSERT INTO pgcoord.lease_events (name, epoch, session, event, reason)
			VALUES (p_name, v_prev_epoch, v_prev_session, 'expired',
				'taken over after the lease lapsed');
		END IF;
		INSERT INTO pgcoord.lease_events (name, epoch, session, replica_id, event)
		VALUES (p_name, v_epoch, p_session, p_replica, 'acquired');
	END IF;
	RETURN QUERY SELECT true, v_epoch, p_session, p_replica, p_ttl_ms;
END $$;

-- Hands a lease back at once, so a campaigner wins on its next try instead
-- of waiting out the ttl. Only the holder can release.
CREATE FUNCTION pgcoord.lease_release(p_name text, p_session bigint, p_reason text)
RETURNS TABLE (released boolean)
LANGUAGE plpgsql AS $$
DECLARE
	v_epoch bigint;
BEGIN
	-- Guarantee 7: a session the janitor expired (janitor_expire_sessions'
	-- reason) had an agent that stopped heartbeating — crashed, frozen, cut
	-- off — so nobody told its client to stop, and the client may believe
	-- until its last renewal + ttl - renew interval, later than the
	-- session's own expiry. Such a lease lapses by its expires_at only.
	IF p_reason = 'owner session expired' THEN
		RETURN QUERY SELECT false;
		RETURN;
	END IF;
	SELECT l.epoch INTO v_epoch FROM pgcoord.leases l
	WHERE l.name = p_name AND l.holder_session = p_session FOR UPDATE;
	IF FOUND THEN
		UPDATE pgcoord.leases
		SET holder_session = NULL, holder_replica = NULL, holder_incarnation = NULL,
		    expires_at = now()
		WHERE name = p_name;
		INSERT INTO pgcoord.lease_events (name, epoch, session, event, reason)
		VALUES (p_name, v_epoch, p_session, 'released', p_reason);
	END IF;
	RETURN QUERY SELECT FOUND;
END $$;

-- Everything that follows from sessions ending (closed by their client,
-- past their grace, expired, or their agent stopped), in the caller's
-- transaction. Later migrations extend it (CREATE OR REPLACE) for permits
-- and records; this is the one place to look.
CREATE FUNCTION pgcoord.on_sessions_ended(p_ids bigint[], p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT l.name, l.holder_session FROM pgcoord.leases l
		 WHERE l.holder_session = ANY (p_ids) ORDER BY l.name
	LOOP
		PERFORM pgcoord.lease_release(r.name, r.holder_session, p_reason);
	END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgcoord.session_close(p_ids bigint[], p_incarnation bigint,
	p_reason text)
RETURNS TABLE (session_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_closed bigint[];
BEGIN
	-- FOR UPDATE: waits for writes under session_lock_live (see there)
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.id = ANY (p_ids) AND s.incarnation = p_incarnation AND s.closed_at IS NULL
	ORDER BY s.id FOR UPDATE;
	WITH c AS (
		UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = p_reason
		WHERE s.id = ANY (p_ids) AND s.incarnation = p_incarnation AND s.closed_at IS NULL
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_closed FROM c;
	PERFORM pgcoord.on_sessions_ended(v_closed, p_reason);
	RETURN QUERY SELECT unnest(v_closed);
END $$;

CREATE OR REPLACE FUNCTION pgcoord.agent_stop(p_replica_id text, p_incarnation bigint)
RETURNS TABLE (closed_sessions bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_closed bigint[];
BEGIN
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
	PERFORM pgcoord.on_sessions_ended(v_closed, 'agent stopped');
	UPDATE pgcoord.agents SET stopped_at = now()
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation;
	RETURN QUERY SELECT coalesce(array_length(v_closed, 1), 0)::bigint;
END $$;

-- The janitor's sweep, run by the one agent that holds the janitor lease:
-- sessions whose heartbeat lapsed are closed (by database time) and their
-- consequences applied, so the live set stays exact. Bounded per call so a
-- backlog never makes one long transaction.
CREATE FUNCTION pgcoord.janitor_expire_sessions(p_limit integer)
RETURNS TABLE (expired bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_ids bigint[];
BEGIN
	WITH c AS (
		UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = 'expired'
		WHERE s.id IN (SELECT id FROM pgcoord.sessions
			       WHERE closed_at IS NULL AND expires_at <= now()
			       ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED)
		  AND s.closed_at IS NULL AND s.expires_at <= now()
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM c;
	PERFORM pgcoord.on_sessions_ended(v_ids, 'owner session expired');
	RETURN QUERY SELECT coalesce(array_length(v_ids, 1), 0)::bigint;
END $$;
