-- An idle agent costs the database one statement and one row a beat.
--
-- Since 0015 a beat writes the agent's row alone, whatever its sessions.
-- What an idle agent still paid beside it was its leases: each renewal of
-- a held lease was a statement of its own (lease_acquire, every ttl/3),
-- which locked the holder's session row and the lease row before it wrote
-- the row, three WAL records and a commit; and every agent that is not the
-- janitor campaigned for the janitor lease once per holder expiry, which
-- locked the same two rows (two lock records and a commit) only to learn
-- that it lost, all 63 of a 64-agent fleet in one burst, in line on the
-- lease row's lock.
--
-- agent_beat: the heartbeat and the renewals that fall due before the
-- next beat in one statement, one transaction, one commit. A renewal there
-- only renews: the row must still name the holder session with the epoch
-- the agent believes in, must not have lapsed, and the session must be
-- live once the beat has renewed its agent (a session the beat pinned or
-- found lost renews nothing). Anything else (a lapsed row, another holder,
-- a released lease) is left to lease_acquire, which the agent calls at
-- once for a renewal the beat did not make, as before: it alone decides a
-- new epoch. A renewal takes no lock on the session row: it can extend a
-- lease only while the row still names its session, and the end of a
-- session frees the row under the row's lock, so whichever commits second
-- sees the other (a renewal after the end finds no holder; an end after
-- the renewal frees the renewed row).
--
-- lease_acquire: a campaign for a lease another session holds and that
-- has not expired is answered from one read of the row, with no lock and
-- no write (a transaction that writes nothing commits without WAL). It is
-- the answer the locked path gives in that case, which still runs
-- whenever the row is free, expired, or the caller's own.
--
-- agent_heartbeat: a beat whose list of sessions is exactly what the
-- database holds attached reads one aggregate of the index instead of
-- every session (below).
--
-- Nothing here changes a table; an agent of the previous version calls
-- agent_heartbeat and lease_acquire as before, and gets these.

-- The heartbeat, as in 0015, with a short way: when the sessions the beat
-- lists are exactly the ones attached to this incarnation (compared by
-- count and a 64-bit hash sum, from the index of attached sessions) and
-- the row had not lapsed, no session is to be pinned, re-attached or
-- reported lost, and the beat is its one update. It used to read every
-- attached session into arrays and take set differences on every beat
-- (0.3 ms of the server's time a beat for 100 sessions); the long way
-- below is 0015's, for the beats that find a difference.
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
	-- the short way: nothing differs (a new statement: it sees what a
	-- janitor or recovery that held the row before us committed)
	IF v_prev > now() AND (
		SELECT count(*) = cardinality(p_sessions)
		       AND coalesce(sum(hashint8extended(s.id, 0)), 0)
			   = (SELECT coalesce(sum(hashint8extended(x, 0)), 0)
			      FROM unnest(p_sessions) AS x)
		FROM pgcoord.sessions s
		WHERE s.replica_id = p_replica_id AND s.incarnation = p_incarnation
		  AND s.closed_at IS NULL AND s.expires_at IS NULL) THEN
		v_result := ROW(true, '{}'::bigint[], pgcoord.ms(now()));
		RETURN v_result;
	END IF;
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

CREATE TYPE pgcoord.beat_result AS (agent_ok boolean, lost bigint[], now_ms bigint,
	renewed boolean[]);

CREATE FUNCTION pgcoord.agent_beat(p_replica_id text, p_incarnation bigint, p_ttl_ms bigint,
	p_sessions bigint[], p_leases text[], p_lease_sessions bigint[], p_lease_epochs bigint[],
	p_lease_ttls bigint[], p_bound_ms integer)
RETURNS pgcoord.beat_result
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_hb pgcoord.heartbeat_result;
	v_n integer := coalesce(cardinality(p_leases), 0);
	v_renewed integer[] := '{}';
	v_i bigint;
BEGIN
	IF v_n <> coalesce(cardinality(p_lease_sessions), 0)
	   OR v_n <> coalesce(cardinality(p_lease_epochs), 0)
	   OR v_n <> coalesce(cardinality(p_lease_ttls), 0) THEN
		RAISE EXCEPTION 'the lease arrays of a beat differ in length' USING ERRCODE = 'PCINV';
	END IF;
	-- the beat's own server-side bound, which the agent sends with it
	-- instead of a set_config() statement before it (one statement a
	-- beat behind a pooler): every wait of a beat is a lock wait
	IF p_bound_ms IS NOT NULL THEN
		PERFORM set_config('lock_timeout', greatest(p_bound_ms, 1) || 'ms', true);
	END IF;
	v_hb := pgcoord.agent_heartbeat(p_replica_id, p_incarnation, p_ttl_ms, p_sessions);
	IF v_hb.agent_ok AND v_n > 0 THEN
		-- a new statement: it sees the sessions as the beat left them
		FOR v_i IN
			UPDATE pgcoord.leases l SET renewed_at = now(), ttl_ms = t.ttl,
				expires_at = now() + pgcoord.ms_interval(t.ttl)
			FROM unnest(p_leases, p_lease_sessions, p_lease_epochs, p_lease_ttls)
				WITH ORDINALITY AS t(name, session, epoch, ttl, i)
			WHERE l.name = t.name AND l.holder_session = t.session AND l.epoch = t.epoch
			  AND l.holder_replica = p_replica_id AND l.expires_at > now()
			  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = t.session)
			RETURNING t.i
		LOOP
			v_renewed := v_renewed || v_i::integer;
		END LOOP;
	END IF;
	RETURN ROW(v_hb.agent_ok, v_hb.lost, v_hb.now_ms,
		ARRAY(SELECT g = ANY (v_renewed) FROM generate_series(1, v_n) AS g ORDER BY g));
END $$;

-- As in 0003, with the read first (above).
CREATE OR REPLACE FUNCTION pgcoord.lease_acquire(p_name text, p_session bigint, p_replica text,
	p_incarnation bigint, p_ttl_ms bigint)
RETURNS pgcoord.lease_decision
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.lease_decision;
	v_epoch bigint;
	v_prev_epoch bigint;
	v_prev_session bigint;
	v_prev_expires timestamptz;
BEGIN
	-- held by another session and not expired: a lost campaign, answered
	-- without a lock or a write
	SELECT false, l.epoch, l.holder_session, l.holder_replica,
	       greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
	INTO v_result.leader, v_result.epoch, v_result.holder_session, v_result.holder_replica,
	     v_result.expires_in_ms
	FROM pgcoord.leases l
	WHERE l.name = p_name AND l.holder_session IS NOT NULL
	  AND l.holder_session IS DISTINCT FROM p_session AND l.expires_at > now();
	IF FOUND THEN
		RETURN v_result;
	END IF;
	IF pgcoord.session_lock_live(p_session) THEN
		-- lock first, so the previous holder we record is the one we replace
		SELECT l.epoch, l.holder_session, l.expires_at
		INTO v_prev_epoch, v_prev_session, v_prev_expires
		FROM pgcoord.leases l WHERE l.name = p_name FOR UPDATE;
		-- held by someone else: answer without drawing a token, so
		-- campaigns do not burn through the sequence
		IF NOT (FOUND AND v_prev_session IS DISTINCT FROM p_session
			AND v_prev_session IS NOT NULL AND v_prev_expires > now()) THEN
			INSERT INTO pgcoord.leases AS l (name, holder_session, holder_replica,
				holder_incarnation, epoch, ttl_ms, acquired_at, renewed_at,
				expires_at)
			VALUES (p_name, p_session, p_replica, p_incarnation,
				nextval('pgcoord.token_seq'), p_ttl_ms, now(), now(),
				now() + pgcoord.ms_interval(p_ttl_ms))
			ON CONFLICT (name) DO UPDATE
			SET epoch = CASE WHEN l.holder_session = p_session AND l.expires_at > now()
					 THEN l.epoch ELSE nextval('pgcoord.token_seq') END,
			    acquired_at = CASE WHEN l.holder_session = p_session
						    AND l.expires_at > now()
					       THEN l.acquired_at ELSE now() END,
			    holder_session = p_session, holder_replica = p_replica,
			    holder_incarnation = p_incarnation, ttl_ms = p_ttl_ms,
			    renewed_at = now(), expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
			WHERE l.holder_session = p_session OR l.holder_session IS NULL
			   OR l.expires_at <= now()
			RETURNING l.epoch INTO v_epoch;
		END IF;
	END IF;

	IF v_epoch IS NULL THEN
		-- not the leader: the lease as it stands (no row: nobody ever held it)
		v_result.leader := false;
		SELECT l.epoch, l.holder_session, l.holder_replica,
		       greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
		INTO v_result.epoch, v_result.holder_session, v_result.holder_replica,
		     v_result.expires_in_ms
		FROM pgcoord.leases l WHERE l.name = p_name;
		RETURN v_result;
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
	v_result := ROW(true, v_epoch, p_session, p_replica, p_ttl_ms);
	RETURN v_result;
END $$;

SELECT pgcoord.secure_functions();
