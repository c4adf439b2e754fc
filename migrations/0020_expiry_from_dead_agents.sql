-- The janitor's session expiry starts from the dead agents, one by one.
--
-- Since 0015 a session attached to its agent (expires_at NULL) lapses with
-- the agent's row, and janitor_expire_sessions found such sessions with one
-- join of agents and sessions. Nothing held the planner to start from the
-- agents: on a sessions table not yet analyzed (a fleet just started, or a
-- burst of sessions since the last analyze) the default estimates make the
-- attached sessions look like one row, and the plan walked every attached
-- session of the fleet, probing its agent for each. With 64 agents of 100
-- sessions that was 6,464 sessions and 12,928 agent probes, 9-12 ms, once a
-- second, to find nothing (scripts/capacity, EXPLAIN at the idle window's
-- end).
--
-- Now the dead agents are read first (the agents table is one row per
-- replica, a short sequential read), and each one's attached sessions are
-- read through sessions_attached by its (replica_id, incarnation): a sweep
-- of a fleet where every agent is alive reads no session. The locks are the
-- join's, taken in the same order: the dead agent's row FOR SHARE (a beat
-- in flight holds it, and is skipped; a beat that committed meanwhile is
-- seen by the lock's re-check, and the agent is alive after all), then its
-- sessions FOR UPDATE, each SKIP LOCKED. An agent whose attached sessions
-- are already gone is not locked: a stopped replica's row stays, and a lock
-- of it every sweep would be a write every sweep.

CREATE OR REPLACE FUNCTION pgcoord.janitor_expire_sessions(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	v_cand bigint[];
	v_ids bigint[];
	v_replica text;
	v_incarnation bigint;
BEGIN
	v_cand := ARRAY(SELECT s.id FROM pgcoord.sessions s
			WHERE s.closed_at IS NULL AND s.expires_at <= now()
			ORDER BY s.expires_at LIMIT p_limit
			FOR UPDATE SKIP LOCKED);
	FOR v_replica, v_incarnation IN
		SELECT a.replica_id, a.incarnation FROM pgcoord.agents a
		WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now()
		ORDER BY a.replica_id
	LOOP
		EXIT WHEN cardinality(v_cand) >= p_limit;
		CONTINUE WHEN NOT EXISTS (
			SELECT 1 FROM pgcoord.sessions s
			WHERE s.replica_id = v_replica AND s.incarnation = v_incarnation
			  AND s.closed_at IS NULL AND s.expires_at IS NULL);
		PERFORM 1 FROM pgcoord.agents a
		WHERE a.replica_id = v_replica AND a.incarnation = v_incarnation
		  AND (a.stopped_at IS NOT NULL OR a.expires_at <= now())
		FOR SHARE SKIP LOCKED;
		CONTINUE WHEN NOT FOUND;
		v_cand := v_cand || ARRAY(
			SELECT s.id FROM pgcoord.sessions s
			WHERE s.replica_id = v_replica AND s.incarnation = v_incarnation
			  AND s.closed_at IS NULL AND s.expires_at IS NULL
			LIMIT p_limit - cardinality(v_cand)
			FOR UPDATE SKIP LOCKED);
	END LOOP;
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

SELECT pgcoord.secure_functions();
