-- Set-based releases (issue 10): a release group, and a lone release (a
-- group of one), in a fixed handful of statements whatever the group's
-- size, with the same answers, audit rows and hand-overs as 0010/0012.
--
-- The common release is a permit that is held by the calling session (of
-- the caller's uid), or any permit not yet released under an override. It
-- takes three statements: the quota rows of every member's permit are
-- locked in key order (0003's lock order: quotas before permits), then
-- one statement releases every such permit that the guard lets through,
-- drops each quota once by the net weight, and writes the audit rows in
-- member order, then the answers. The permit rows are locked by that
-- UPDATE itself: no row-lock WAL record before it (0003 read each one
-- FOR UPDATE first), and no per-member subtransaction.
--
-- Every member the statement did not release (an id with no permit: it is
-- retired; already released; another session's, another uid's, uncertain)
-- is answered by permit_release_as (0006), unchanged: it changes nothing
-- in these cases, or retires the id, so running it after the others gives
-- what it would have given in arrival order. Such members are the rare
-- ones, and in a group of several each runs in a subtransaction of its own
-- as in 0010, so an error of one comes back in its own row.
--
-- A group that names one id twice keeps 0010's member-by-member loop: the
-- second release of an id must see the first.

CREATE OR REPLACE FUNCTION pgcoord.permit_release_group(p_uids bigint[], p_ids text[],
	p_sessions bigint[], p_overrides boolean[], p_actors text[], p_reasons text[])
RETURNS TABLE (member integer, err_state text, err_message text, outcome text, detail text,
	released boolean, state text, released_at bigint, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
	v_n integer := coalesce(cardinality(p_ids), 0);
	v_done integer[];
	i integer;
BEGIN
	IF v_n > 1 AND cardinality(ARRAY(SELECT DISTINCT unnest(p_ids))) <> v_n THEN
		PERFORM pgcoord.permits_lock_quotas(p_ids);
		FOR i IN 1 .. v_n LOOP
			BEGIN
				RETURN QUERY SELECT i, NULL::text, NULL::text, r.*
				FROM pgcoord.permit_release_as(p_uids[i], p_ids[i], p_sessions[i],
					p_overrides[i], p_actors[i], p_reasons[i]) r;
			EXCEPTION WHEN OTHERS THEN
				RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text, NULL::text,
					NULL::text, NULL::boolean, NULL::text, NULL::bigint,
					NULL::bigint;
			END;
		END LOOP;
		RETURN;
	END IF;

	PERFORM 1 FROM pgcoord.quotas q
	WHERE q.key = ANY (ARRAY(SELECT DISTINCT pq.key FROM pgcoord.permit_quotas pq
				 WHERE pq.permit_id = ANY (p_ids)))
	ORDER BY q.key
	FOR NO KEY UPDATE OF q;

	WITH m AS (
		SELECT * FROM unnest(p_ids, p_uids, p_sessions, p_overrides, p_actors, p_reasons)
			WITH ORDINALITY AS m(id, uid, session, override, actor, reason, i)),
	r AS (
		UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
			state_at = now()
		FROM m
		WHERE p.id = m.id AND p.state <> 'released'
		  AND (m.override OR p.state = 'held')
		  AND (m.override OR (p.owner_session = m.session
		       AND pgcoord.session_owner_uid(p.owner_session) IS NOT DISTINCT FROM m.uid))
		RETURNING m.i, p.id, p.phase, p.owner_replica, m.override, m.actor, m.reason),
	s AS (
		SELECT r.*, pq.key, pq.weight FROM r JOIN pgcoord.permit_quotas pq
			ON pq.permit_id = r.id),
	u AS (
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - t.w
		FROM (SELECT s.key, sum(s.weight) AS w FROM s GROUP BY s.key) t
		WHERE q.key = t.key),
	e AS (
		INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason,
			state, phase)
		SELECT s.id, s.key, -s.weight,
		       CASE WHEN s.override THEN 'override_released' ELSE 'released' END,
		       coalesce(s.actor, 'agent@' || coalesce(s.owner_replica, '?')), s.reason,
		       'released', s.phase
		FROM s ORDER BY s.i, s.key)
	SELECT coalesce(array_agg(r.i::integer), '{}') INTO v_done FROM r;

	RETURN QUERY SELECT d.i, NULL::text, NULL::text, 'ok'::text, NULL::text, true,
		'released'::text, pgcoord.ms(now()), pgcoord.ms(now())
	FROM unnest(v_done) AS d(i);
	IF cardinality(v_done) = v_n THEN
		RETURN;
	END IF;

	-- the members left: answered (or retired) as a lone release would
	IF v_n = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, r.*
		FROM pgcoord.permit_release_as(p_uids[1], p_ids[1], p_sessions[1],
			p_overrides[1], p_actors[1], p_reasons[1]) r;
		RETURN;
	END IF;
	FOR i IN 1 .. v_n LOOP
		CONTINUE WHEN i = ANY (v_done);
		BEGIN
			RETURN QUERY SELECT i, NULL::text, NULL::text, r.*
			FROM pgcoord.permit_release_as(p_uids[i], p_ids[i], p_sessions[i],
				p_overrides[i], p_actors[i], p_reasons[i]) r;
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text, NULL::text,
				NULL::text, NULL::boolean, NULL::text, NULL::bigint, NULL::bigint;
		END;
	END LOOP;
END $$;

SELECT pgcoord.secure_functions();
