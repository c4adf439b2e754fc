-- The janitor's sweep, once a second, costs what is open, not the past,
-- and little per open row.
--
-- 1. Session expiry reads open sessions only.
--
-- Session rows stay after they close (nothing deletes them), so the table
-- grows with every session a fleet ever opened. janitor_expire_sessions
-- looks for open sessions past their expiry in id order; once PL/pgSQL
-- settles on its generic plan (from the sixth call of a backend on), that
-- plan walked the primary key through every row, closed ones included: a
-- sweep a second whose cost grew with the fleet's whole past (50,202 rows
-- read for 201 open sessions after 50,000 closed ones; janitor-scan).
--
-- This index holds the open sessions in id order, so the same statement
-- reads only them. Its column (id) and its predicate (closed_at) are never
-- changed by the heartbeat, which renews expires_at alone: the heartbeat's
-- updates stay HOT and the index costs liveness nothing.
CREATE INDEX sessions_open_by_id ON pgcoord.sessions (id) WHERE closed_at IS NULL;

-- 2. The permit duty's safety net (held permits whose owner is no longer
-- live) asked pgcoord.session_is_live once per open permit. Like every
-- function here it is SECURITY DEFINER, which PostgreSQL never inlines: a
-- full function call per row, about 20 µs each, so 10,000 held permits took
-- 160–260 ms of every one-second sweep. The same test written as NOT EXISTS
-- over pgcoord.sessions is planned as one anti-join. Everything else is as
-- 0003 wrote it.
CREATE OR REPLACE FUNCTION pgcoord.janitor_lapse_permits(p_limit integer,
	p_actor text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
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
		AND NOT EXISTS (SELECT 1 FROM pgcoord.sessions s
				WHERE s.id = p.owner_session AND s.closed_at IS NULL
				  AND s.expires_at > now())
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

-- The function replaced above lost SECURITY DEFINER and the pinned
-- search_path; secure it in this migration's own transaction, as 0007 and
-- 0008 do, so that a later failing step of the runner cannot leave it bare.
SELECT pgcoord.secure_functions();
