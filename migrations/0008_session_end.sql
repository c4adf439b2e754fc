-- What a session's end sets off, and the janitor's sweep of sessions.
--
-- A session ends by close, by its agent's stop, or by expiry (the janitor).
-- Each way calls on_sessions_ended once, in the same transaction, so the
-- consequences (leases released, permits handled per their on_owner_loss,
-- waiting claims of the session leaving their queues) happen exactly once
-- whichever way it ended.
--
-- Session expiry reads open sessions only: session rows stay after they
-- close, and the index sessions_open_by_id holds the open ones in id order.
-- Its column (id) and predicate (closed_at) are never changed by the
-- heartbeat, which renews expires_at alone: the heartbeat's updates stay
-- HOT and the index costs liveness nothing.

-- Everything that follows from sessions ending (closed by their client,
-- past their grace, expired, or their agent stopped), in the caller's
-- transaction: waiting claims leave their queues, leases are released,
-- permits follow their on_owner_loss. This is the one place to look.
-- p_reason is recorded in the audit; p_end (pgcoord.session_end) decides.
CREATE FUNCTION pgcoord.on_sessions_ended(p_ids bigint[], p_reason text,
	p_end pgcoord.session_end)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT w.seq FROM pgcoord.waiters w
		 WHERE w.session = ANY (p_ids) AND w.state = 'queued' ORDER BY w.seq
	LOOP
		PERFORM pgcoord.waiter_leave(r.seq, NULL, NULL);
	END LOOP;
	DELETE FROM pgcoord.waiters w WHERE w.session = ANY (p_ids);
	-- Guarantee 7: a lapsed session's agent stopped heartbeating, so nobody
	-- told its client to stop, and the client may believe it leads until
	-- its last renewal + ttl - renew interval, later than the session's own
	-- expiry. Its leases lapse by their expires_at only.
	IF p_end <> 'lapsed' THEN
		FOR r IN SELECT l.name, l.holder_session FROM pgcoord.leases l
			 WHERE l.holder_session = ANY (p_ids) ORDER BY l.name
		LOOP
			PERFORM pgcoord.lease_release(r.name, r.holder_session, p_reason);
		END LOOP;
	END IF;
	PERFORM pgcoord.permits_owner_lost(p_ids, p_reason,
		CASE WHEN p_end = 'lapsed' THEN pgcoord.janitor_actor() END);
END $$;

-- The session ends below answer how many sessions they closed.
CREATE FUNCTION pgcoord.session_close(p_ids bigint[], p_incarnation bigint,
	p_reason text)
RETURNS bigint
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
	PERFORM pgcoord.on_sessions_ended(v_closed, p_reason, 'ended');
	RETURN cardinality(v_closed);
END $$;

CREATE FUNCTION pgcoord.agent_stop(p_replica_id text, p_incarnation bigint)
RETURNS bigint
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
	PERFORM pgcoord.on_sessions_ended(v_closed, 'agent stopped', 'ended');
	UPDATE pgcoord.agents SET stopped_at = now()
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation;
	RETURN cardinality(v_closed);
END $$;

-- The janitor's sweep, run by the one agent that holds the janitor lease:
-- sessions whose heartbeat lapsed are closed (by database time) and their
-- consequences applied, so the live set stays exact. Bounded per call so a
-- backlog never makes one long transaction.
CREATE FUNCTION pgcoord.janitor_expire_sessions(p_limit integer)
RETURNS bigint
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
	PERFORM pgcoord.on_sessions_ended(v_ids, 'owner session expired', 'lapsed');
	RETURN cardinality(v_ids);
END $$;

SELECT pgcoord.secure_functions();
