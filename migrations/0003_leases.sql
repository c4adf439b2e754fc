-- Leadership leases (guarantee 7): the one place where a session's end has
-- consequences beyond the session itself (see on_sessions_ended).

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

-- What lease_acquire answers. leader = false is not a refusal: the row
-- names the lease as it stands (its holder and how long it has left), and a
-- campaign tries again.
CREATE TYPE pgcoord.lease_decision AS (leader boolean, epoch bigint, holder_session bigint,
	holder_replica text, expires_in_ms bigint);

-- Acquires or renews, in one atomic upsert. The WHERE admits only the
-- current holder or a free/expired row, judged by the database clock, so
-- two agents' clocks can never elect two leaders. A session that is not
-- live cannot acquire (checked under the session row's lock).
CREATE FUNCTION pgcoord.lease_acquire(p_name text, p_session bigint, p_replica text,
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

-- What lease_release answers. released = false is not a refusal: the
-- session did not hold the lease (any more), which is what it asked for.
CREATE TYPE pgcoord.lease_hand_back AS (released boolean);

-- Hands a lease back at once, so a campaigner wins on its next try instead
-- of waiting out the ttl. Only the holder can release. A lapsed holder's
-- lease is never released here: see on_sessions_ended.
CREATE FUNCTION pgcoord.lease_release(p_name text, p_session bigint, p_reason text)
RETURNS pgcoord.lease_hand_back
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.lease_hand_back;
	v_epoch bigint;
BEGIN
	SELECT l.epoch INTO v_epoch FROM pgcoord.leases l
	WHERE l.name = p_name AND l.holder_session = p_session FOR UPDATE;
	v_result.released := FOUND;
	IF v_result.released THEN
		UPDATE pgcoord.leases
		SET holder_session = NULL, holder_replica = NULL, holder_incarnation = NULL,
		    expires_at = now()
		WHERE name = p_name;
		INSERT INTO pgcoord.lease_events (name, epoch, session, event, reason)
		VALUES (p_name, v_epoch, p_session, 'released', p_reason);
	END IF;
	RETURN v_result;
END $$;

SELECT pgcoord.secure_functions();
