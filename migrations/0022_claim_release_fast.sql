-- The common claim and release, each group of them one SQL statement.
--
-- permit_claim_group and permit_release_group judge a group in PL/pgSQL:
-- a dozen statements, loops that append to arrays member by member, and
-- the expression evaluator for every line. Under load that interpreter was
-- most of the backend's time on the claim path (45% of it at one worker,
-- 77% at 32), more than the rows it wrote. The common member (one quota,
-- no per-call limit, a new id, a live session; a release of a held permit
-- of one quota by its own session) needs none of it: its admission is a
-- running sum per quota, its release a join. Here both are one statement
-- of data-modifying CTEs over the group's arrays, in a function whose body
-- is that one statement (RETURN QUERY: its plan is prepared once per
-- connection, generic, as a prepared statement's would be; the runtime
-- role may only call functions, so the statement cannot be the agent's).
--
-- A member the statement does not judge answers err_state 'PCSLW' (not a
-- SQLSTATE anyone raises) and nothing of it is written: the agent sends it
-- on to permit_claim_group or permit_release_group, which judge it exactly
-- as before. That is the rare member: an id that exists (a retry), a
-- duplicate id in the group, two or more quotas, a per-call limit, a
-- session that is not live, an unknown quota, a denial the statement
-- cannot be sure of (below), a release of anything but a held one-quota
-- permit of the caller's session, an override or a reason.
--
-- Guarantees, as the group functions keep them:
--
-- 1 (quota at every instant). The quota rows are locked FOR NO KEY UPDATE
--   in key order (after the session rows: the lock order is unchanged);
--   the lock reads the latest committed row, so the judging is against
--   what is true now. A member is admitted when in_flight plus the weights
--   of the members before it on that quota (arrival order) fits the limit
--   and nobody waits. The counters then move by the net weight per quota.
--   With unequal weights on one quota a denial leaves room a lighter later
--   member could take, which a running sum does not see: the members after
--   the first denial on such a quota go to the slow path.
-- 3 (one grant per id). The id is read with the statement's snapshot,
--   taken before the locks. A duplicate that committed while this one
--   waited for a quota row is not seen: an admitted member then fails the
--   insert on permits_pkey (unique_violation; the agent sends the whole
--   group to the slow path, which reads the id again), and a denied one
--   would wrongly be answered `denied` instead of the grant. The duplicate
--   names the same quota and its admission wrote that row, so the row the
--   lock returned is not the one the snapshot shows: a denial on such a
--   row goes to the slow path.
-- 2 and audit. The admission and the release are in the permit row
--   (admit_event, release_event: 0016), drawn under the quota rows' locks;
--   a release of a permit whose admission is not in its row writes its log
--   row, as before. Tokens are drawn in arrival order under the locks.
-- FIFO hand-over. A claim is admitted only where nobody waits; a release
--   lowers in_flight, and the deferred trigger quotas_hand_over admits the
--   queue at commit, as for every other release.
--
-- Nothing else changes: new functions, no table touched, so an agent of
-- the previous version goes on calling the group functions, and permits
-- held, uncertain or queued before the upgrade are released by either.

CREATE FUNCTION pgcoord.permit_claim_fast(p_uids bigint[], p_admins boolean[],
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
BEGIN
	-- One pipeline of the members, no join between them: each step reads
	-- the one before in the order it needs (a join of two CTEs of n rows
	-- is planned as a nested loop, n * n comparisons).
	RETURN QUERY
	WITH m AS MATERIALIZED (
		-- the members, and whether each is one this statement may judge
		SELECT u.i::integer AS i, u.id, u.sess, u.replica, u.ool, u.intent, u.actor,
		       (u.k::text[])[1] AS k, (u.w::integer[])[1] AS w,
		       coalesce(u.lim IS NULL AND octet_length(u.id) BETWEEN 1 AND 200
			AND u.ool IN ('uncertain', 'release') AND u.actor IS NOT NULL
			AND coalesce(octet_length(u.intent), 0) <= 65536 AND u.sess IS NOT NULL
			AND cardinality(u.k::text[]) = 1 AND array_lower(u.k::text[], 1) = 1
			AND cardinality(u.w::integer[]) = 1 AND array_lower(u.w::integer[], 1) = 1
			AND octet_length((u.k::text[])[1]) BETWEEN 1 AND 200
			AND (u.w::integer[])[1] >= 1
			AND count(*) OVER (PARTITION BY u.id) = 1, false) AS ok
		FROM unnest(p_ids, p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss,
			    p_intents, p_limits, p_actors) WITH ORDINALITY
			AS u(id, k, w, sess, replica, ool, intent, lim, actor, i)),
	live AS MATERIALIZED (
		-- their sessions, each locked in id order as session_lock_live
		-- locks one; the lateral probe keeps the plan one index probe per
		-- session
		SELECT l.id FROM (SELECT DISTINCT m.sess FROM m WHERE m.ok ORDER BY 1) d
		CROSS JOIN LATERAL (
			SELECT s.id FROM pgcoord.sessions s
			WHERE s.id = d.sess AND s.closed_at IS NULL
			  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
			FOR KEY SHARE) l),
	c AS MATERIALIZED (
		-- judged here: valid, of a live session, a new id
		-- (the id probed by the lateral: a NOT EXISTS here may be
		-- planned as one hashed read of the whole permits table)
		SELECT m.*, m.ok AND EXISTS (SELECT 1 FROM live WHERE live.id = m.sess)
			AND x.id IS NULL AS judged
		FROM m LEFT JOIN LATERAL (
			SELECT p.id FROM pgcoord.permits p WHERE p.id = m.id LIMIT 1) x ON true),
	l AS MATERIALIZED (
		-- the quota row of each judged member, locked in key order once
		-- every session is (the one-time filter reads all of live first);
		-- a row locked again by the next member of its key is not waited
		-- for, and the lock returns the latest committed version
		SELECT c.*, x.key IS NOT NULL AS known, x."limit", x.in_flight, x.waiting,
		       x.ctid AS tid
		FROM (SELECT * FROM c ORDER BY c.k COLLATE "C", c.i) c
		LEFT JOIN LATERAL (
			SELECT x.key, x."limit", x.in_flight, x.waiting, x.ctid FROM pgcoord.quotas x
			WHERE x.key = c.k AND c.judged FOR NO KEY UPDATE) x ON true
		WHERE (SELECT count(*) FROM live) >= 0),
	j AS MATERIALIZED (
		-- judged in arrival order per quota: the weights of the judged
		-- members before each, with its own
		SELECT l.*,
		       l.judged AND l.known AND l.waiting = 0
			AND l.in_flight + sum(l.w) FILTER (WHERE l.judged)
				OVER (PARTITION BY l.k ORDER BY l.i) <= l."limit" AS fits,
		       min(l.w) FILTER (WHERE l.judged) OVER (PARTITION BY l.k)
			<> max(l.w) FILTER (WHERE l.judged) OVER (PARTITION BY l.k) AS uneven
		FROM l),
	d AS MATERIALIZED (
		SELECT j.i, j.id, j.sess, j.replica, j.ool, j.intent, j.actor, j.k, j.w,
		       j."limit",
		       CASE WHEN j.fits THEN 'admitted'
			    WHEN NOT j.judged OR NOT j.known THEN NULL
			    -- the row moved since the snapshot: a duplicate of the
			    -- id may have been admitted meanwhile (above)
			    WHEN (SELECT x.ctid FROM pgcoord.quotas x WHERE x.key = j.k)
				 IS DISTINCT FROM j.tid THEN NULL
			    WHEN j.uneven AND j.waiting = 0
				 AND j.i > min(j.i) FILTER (WHERE j.judged AND NOT j.fits)
					   OVER (PARTITION BY j.k) THEN NULL
			    ELSE 'denied' END AS verdict,
		       j.in_flight + coalesce(sum(j.w) FILTER (WHERE j.fits)
						  OVER (PARTITION BY j.k), 0) AS taken
		FROM j),
	t AS MATERIALIZED (
		-- tokens and admission events drawn in arrival order (volatile
		-- output is computed after the sort), under the quota rows' locks
		SELECT d.*,
		       CASE WHEN d.verdict = 'admitted' THEN nextval('pgcoord.token_seq') END
			AS token,
		       CASE WHEN d.verdict = 'admitted'
			    THEN nextval('pgcoord.permit_events_id_seq') END AS admit_event
		FROM d ORDER BY d.i),
	ins AS (
		INSERT INTO pgcoord.permits (id, token, owner_session, owner_replica, state, phase,
			on_owner_loss, intent, quota_key, quota_weight, admit_event, admit_actor)
		SELECT t.id, t.token, t.sess, t.replica, 'held', 'reserved', t.ool, t.intent, t.k,
		       t.w, t.admit_event, t.actor
		FROM t WHERE t.verdict = 'admitted'),
	upd AS (
		UPDATE pgcoord.quotas x SET in_flight = x.in_flight + g.w
		FROM (SELECT t.k, sum(t.w) AS w FROM t WHERE t.verdict = 'admitted'
		      GROUP BY t.k) g
		WHERE x.key = g.k)
	SELECT t.i,
	       CASE WHEN t.verdict IS NULL THEN 'PCSLW' END,
	       CASE WHEN t.verdict IS NULL THEN 'judged by permit_claim_group' END,
	       t.verdict::pgcoord.claim_status,
	       t.token,
	       CASE WHEN t.verdict = 'admitted' THEN 'held' END,
	       CASE WHEN t.verdict = 'admitted' THEN 'reserved' END,
	       CASE WHEN t.verdict = 'admitted' THEN t.sess END,
	       CASE WHEN t.verdict = 'admitted' THEN t.replica END,
	       CASE WHEN t.verdict = 'admitted' THEN (extract(epoch FROM now()) * 1000)::bigint
	       END,
	       NULL::bigint,
	       CASE WHEN t.verdict = 'denied' THEN t.k END,
	       CASE WHEN t.verdict = 'denied' THEN t."limit" END,
	       CASE WHEN t.verdict = 'denied' THEN t.taken END,
	       (extract(epoch FROM now()) * 1000)::bigint,
	       NULL::bigint, NULL::bigint, NULL::bigint
	FROM t;
END $$;

CREATE FUNCTION pgcoord.permit_release_fast(p_uids bigint[], p_ids text[],
	p_sessions bigint[], p_overrides boolean[], p_actors text[], p_reasons text[])
RETURNS TABLE (member integer, err_state text, err_message text,
	status pgcoord.release_status, state text, released_at bigint, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
	SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
	RETURN QUERY
	WITH m AS MATERIALIZED (
		-- the members, each with the quota of its permit when that is a
		-- held one-quota permit of its session (read by id, no lock)
		SELECT u.i::integer AS i, u.id, u.uid, u.sess, u.actor, x.quota_key AS k
		FROM (SELECT u.*,
			     coalesce(u.override IS FALSE AND u.reason IS NULL AND u.sess IS NOT NULL
				      AND count(*) OVER (PARTITION BY u.id) = 1, false) AS ok
		      FROM unnest(p_ids, p_uids, p_sessions, p_overrides, p_actors, p_reasons)
			WITH ORDINALITY AS u(id, uid, sess, override, actor, reason, i)) u
		LEFT JOIN LATERAL (
			SELECT x.quota_key FROM pgcoord.permits x
			WHERE x.id = u.id AND u.ok AND x.released_at IS NULL
			  AND x.state IS NOT DISTINCT FROM 'held' AND x.quota_key IS NOT NULL
			  AND x.owner_session = u.sess
			OFFSET 0) x ON true),
	lk AS MATERIALIZED (
		-- their quota rows, locked in key order before any permit row (the
		-- lock order: quotas, then permits)
		SELECT l.key FROM (SELECT DISTINCT m.k COLLATE "C" AS k FROM m
				   WHERE m.k IS NOT NULL ORDER BY 1) k
		CROSS JOIN LATERAL (
			SELECT x.key FROM pgcoord.quotas x WHERE x.key = k.k
			FOR NO KEY UPDATE) l),
	r AS (
		-- the guard of permit_release_group's UPDATE, probed by id (the
		-- state test is written so that it does not imply the predicate of
		-- permits_open_by_owner, which would let the plan walk every open
		-- permit). The array of locked keys is an init plan: every quota
		-- row is locked before the first permit row is. A row released or
		-- changed meanwhile fails the guard on its latest version and goes
		-- to the slow path.
		UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
			state_at = now(),
			release_event = CASE WHEN p.admit_event IS NOT NULL
				THEN nextval('pgcoord.permit_events_id_seq') END,
			release_actor = CASE WHEN p.admit_event IS NOT NULL
				THEN nullif(coalesce(m.actor, 'agent@' || coalesce(p.owner_replica, '?')),
					    p.admit_actor) END
		FROM m
		WHERE m.k IS NOT NULL AND p.id = m.id AND p.released_at IS NULL
		  AND p.state IS NOT DISTINCT FROM 'held' AND p.owner_session = m.sess
		  AND p.quota_key = ANY ((SELECT array_agg(lk.key) FROM lk)::text[])
		  AND (SELECT s.owner_uid FROM pgcoord.sessions s
		       WHERE s.id = p.owner_session) IS NOT DISTINCT FROM m.uid
		RETURNING m.i, p.id, p.phase, p.owner_replica, m.actor, p.quota_key,
			p.quota_weight, p.release_event),
	u AS (
		UPDATE pgcoord.quotas x SET in_flight = x.in_flight - g.w
		FROM (SELECT r.quota_key AS k, sum(r.quota_weight) AS w FROM r
		      GROUP BY r.quota_key) g
		WHERE x.key = g.k),
	e AS (
		-- a permit whose admission is not in its row (admitted before 0016,
		-- or without an actor) has its release in the log
		INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor,
			state, phase)
		SELECT r.id, r.quota_key, -r.quota_weight, 'released',
		       coalesce(r.actor, 'agent@' || coalesce(r.owner_replica, '?')),
		       'released', r.phase
		FROM r WHERE r.release_event IS NULL ORDER BY r.i),
	done AS (SELECT coalesce(array_agg(r.i), '{}') AS i FROM r)
	SELECT m.i,
	       CASE WHEN NOT m.released THEN 'PCSLW' END,
	       CASE WHEN NOT m.released THEN 'judged by permit_release_group' END,
	       CASE WHEN m.released THEN 'released' END::pgcoord.release_status,
	       CASE WHEN m.released THEN 'released' END,
	       CASE WHEN m.released THEN (extract(epoch FROM now()) * 1000)::bigint END,
	       (extract(epoch FROM now()) * 1000)::bigint
	FROM (SELECT m.i, m.i = ANY ((SELECT done.i FROM done)::integer[]) AS released
	      FROM m) m
	ORDER BY m.i;
END $$;

SELECT pgcoord.secure_functions();
