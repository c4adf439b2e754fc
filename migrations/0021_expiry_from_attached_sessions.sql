-- The janitor's session expiry reads the agents that still have attached
-- sessions, not every replica the fleet ever had.
--
-- 0020 walked the whole agents table each sweep and probed the attached
-- sessions of every dead row, one statement each. A replica's row stays
-- after it stops, so a fleet whose replica ids come and go (hosts
-- replaced, names made per machine or per pod) gathers dead rows, and the
-- sweep, once a second, paid a probe for each: 20,000 stopped replicas with
-- their sessions long closed cost 67-74 ms a sweep to find nothing.
--
-- Now one statement joins the dead agent rows with the distinct
-- (replica_id, incarnation) pairs that have attached sessions, walked
-- through sessions_attached by its leading columns (a skip scan written out
-- as a recursive query: each step is one index probe past the previous
-- pair). Only a living agent, or one that died since the last sweep, has
-- attached sessions (the expiry closes them, a stop closes them, a
-- registration pins them), so the walk costs one probe per living agent.
-- The planner picks the side: with no dead row the join ends after
-- reading the agents (0.02-0.03 ms a sweep at 64 agents, as 0020), with
-- many it walks the pairs and probes their rows. A sweep among 64 living
-- agents and 20,000 stopped ones costs 0.33 ms; among 200,000, 0.55 ms.
--
-- The locks are 0020's, in the same order: the dead agent's row FOR SHARE
-- SKIP LOCKED (a beat in flight holds it; a beat that committed meanwhile
-- is seen by the lock's re-check, and the agent is alive after all), then
-- its sessions FOR UPDATE SKIP LOCKED. A living agent's row is not locked.

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
		WITH RECURSIVE attached AS (
			(SELECT s.replica_id, s.incarnation FROM pgcoord.sessions s
			 WHERE s.closed_at IS NULL AND s.expires_at IS NULL
			 ORDER BY s.replica_id, s.incarnation LIMIT 1)
			UNION ALL
			SELECT n.replica_id, n.incarnation
			FROM attached p, LATERAL (
				SELECT s.replica_id, s.incarnation FROM pgcoord.sessions s
				WHERE s.closed_at IS NULL AND s.expires_at IS NULL
				  AND (s.replica_id, s.incarnation) > (p.replica_id, p.incarnation)
				ORDER BY s.replica_id, s.incarnation LIMIT 1) n)
		SELECT a.replica_id, a.incarnation
		FROM attached t
		JOIN pgcoord.agents a ON a.replica_id = t.replica_id AND a.incarnation = t.incarnation
		WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now()
		ORDER BY a.replica_id
	LOOP
		EXIT WHEN cardinality(v_cand) >= p_limit;
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
