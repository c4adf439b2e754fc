-- The janitor's session expiry costs the agents that still have attached
-- sessions, not every replica the fleet ever had.
--
-- 0020 walked the whole agents table each sweep and probed the attached
-- sessions of every dead row, one statement apiece. A replica's row stays
-- after it stops, so a fleet whose replica ids come and go (hosts
-- replaced, names made per machine or per pod) gathers dead rows, and the
-- sweep, once a second, paid a probe for each: 20,000 stopped replicas with
-- their sessions long closed cost 72-90 ms a sweep to find nothing, 200,000
-- cost 0.5-1.1 s.
--
-- Now the sweep first counts the dead rows, up to 257. With at most 256 it
-- probes each, as 0020 did (a fleet where few replicas ever left pays what
-- it paid). With more, it reads the distinct (replica_id, incarnation)
-- pairs that have attached sessions through sessions_attached by its
-- leading columns (a skip scan written out as a recursive query: each step
-- one index probe past the previous pair) and joins them with the dead
-- rows. Only a living agent, or one that died since the last sweep, has
-- attached sessions (the expiry closes them, a stop closes them, a
-- registration pins them), so that walk costs a probe per living agent,
-- whatever the past: 0.3-1.9 ms a sweep among 64 living agents and 2,000
-- to 200,000 dead rows, analyzed or not.
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
	v_replicas text[];
	v_incarnations bigint[];
BEGIN
	v_cand := ARRAY(SELECT s.id FROM pgcoord.sessions s
			WHERE s.closed_at IS NULL AND s.expires_at <= now()
			ORDER BY s.expires_at LIMIT p_limit
			FOR UPDATE SKIP LOCKED);
	-- Few dead rows (the common case): each one's sessions probed, as 0020.
	-- Many: the agents with attached sessions, by the skip scan. Gathered
	-- whole (arrays, not a cursor: a cursor is planned for its first rows,
	-- and walked every agent row by its key to return them in order).
	IF (SELECT count(*) FROM (SELECT 1 FROM pgcoord.agents a
				  WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now()
				  LIMIT 257) d) <= 256 THEN
		SELECT array_agg(a.replica_id ORDER BY a.replica_id),
		       array_agg(a.incarnation ORDER BY a.replica_id)
		INTO v_replicas, v_incarnations
		FROM pgcoord.agents a
		WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now();
	ELSE
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
		SELECT array_agg(a.replica_id ORDER BY a.replica_id),
		       array_agg(a.incarnation ORDER BY a.replica_id)
		INTO v_replicas, v_incarnations
		FROM attached t
		JOIN pgcoord.agents a ON a.replica_id = t.replica_id
			AND a.incarnation = t.incarnation
		WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now();
	END IF;
	FOR i IN 1 .. coalesce(cardinality(v_replicas), 0) LOOP
		EXIT WHEN cardinality(v_cand) >= p_limit;
		v_replica := v_replicas[i];
		v_incarnation := v_incarnations[i];
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
