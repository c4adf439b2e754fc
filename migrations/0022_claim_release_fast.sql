-- The common claim and release of a group, each one SQL statement.
--
-- permit_claim_group and permit_release_group judge a group in PL/pgSQL, a
-- dozen statements with loops over the members, and they lock each quota
-- row (a WAL record) before they update it (another). The common group
-- needs neither: its members each name one quota, with no per-call limit,
-- a new id and a live session, and most quotas have room for all of their
-- members at once; a release is of a held one-quota permit by its own
-- session. Here each is one statement of data-modifying CTEs over the
-- group's arrays, in a function whose body is that one statement (RETURN
-- QUERY: its plan is prepared once per connection, generic, as a prepared
-- statement's would be; the runtime role may only call functions, so the
-- statement cannot be the agent's own).
--
-- A member the statement does not admit or release answers err_state
-- 'PCSLW' (no SQLSTATE anyone raises) and nothing of it is written: the
-- agent sends it on to permit_claim_group or permit_release_group, which
-- judge it exactly as before. That is the rare member: an id that exists
-- (a retry), a duplicate id in the group, two or more quotas, a per-call
-- limit, a session that is not live, an unknown quota, a quota without
-- room for all of the group's members on it (the group function then
-- admits those that fit, in arrival order, and denies the others), a
-- release of anything but a held one-quota permit of the caller's
-- session, an override or a reason. A group whose statement fails as a
-- whole on a unique violation (below) or serialization_failure goes to the
-- group function entire, nothing of it kept.
--
-- Guarantees, as the group functions keep them:
--
-- 1 (quota at every instant). One conditional UPDATE per quota, in key
--   order after the session rows (the lock order is unchanged): in_flight
--   rises by the weight of all of its members when that fits the limit and
--   nobody waits. Postgres re-checks the condition on the latest row
--   version under the row lock, as for a lone claim; the update takes the
--   lock itself, so no lock record is written. All or none of a quota's
--   members: a prefix of them in arrival order is exactly what judging
--   them one by one would admit when all fit.
-- 3 (one grant per id). The id is read with the statement's snapshot. A
--   duplicate that committed while this statement waited for a quota row
--   is not seen, and then the insert fails on permits_pkey
--   (unique_violation): the agent sends the group to the group function,
--   which reads the id again. Nothing here answers from what the snapshot
--   cannot see: no denial is answered here.
-- 2 and audit. The admission and the release are in the permit row
--   (admit_event, release_event: 0016), drawn after the quota rows'
--   updates, under their locks; a release of a permit whose admission is
--   not in its row writes its log row, as before. Tokens are drawn in
--   arrival order under the locks.
-- Releases. The permits are read by id without a lock, their quota rows
--   decremented in key order, then the permit rows updated under the guard
--   of permit_release_group (the lock order: quotas, then permits). A
--   permit released or changed in between fails the guard on its latest
--   version; its decrement cannot be given back in the same statement (a
--   row is updated once per statement), so the statement raises
--   serialization_failure, everything rolls back, and the agent sends the
--   group to the group function.
-- FIFO hand-over. A claim is admitted only where nobody waits; a release
--   lowers in_flight, and the deferred trigger quotas_hand_over admits the
--   queue at commit, as for every other release.
--
-- Nothing else changes: new functions, no table touched, so an agent of
-- the previous version goes on calling the group functions, and permits
-- held, uncertain or queued before the upgrade are released by either.

-- Raised inside a statement that found a row changed under it after it
-- had written what it cannot take back.
CREATE FUNCTION pgcoord.changed_meanwhile(p_what text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	RAISE serialization_failure USING MESSAGE = p_what,
		HINT = 'nothing of it stayed; the agent sends the group again, member by member';
END $$;

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
	-- One pipeline of the members, no join between two of its steps: a
	-- join of two CTEs of n rows is planned as a nested loop, n * n
	-- comparisons; a union sorted by key hands a quota's verdict to its
	-- members instead.
	RETURN QUERY
	WITH m AS MATERIALIZED (
		-- the members, and whether each is one this statement may admit
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
		-- may be admitted here: valid, of a live session, a new id (probed
		-- by the lateral: a NOT EXISTS here may be planned as one hashed
		-- read of the whole permits table)
		SELECT m.*, m.ok AND EXISTS (SELECT 1 FROM live WHERE live.id = m.sess)
			AND x.id IS NULL AS judged
		FROM m LEFT JOIN LATERAL (
			SELECT p.id FROM pgcoord.permits p WHERE p.id = m.id LIMIT 1) x ON true),
	upd AS (
		-- guarantee 1: each quota with room for all of its members, in key
		-- order once every session is locked (the one-time filter reads all
		-- of live first)
		UPDATE pgcoord.quotas x SET in_flight = x.in_flight + g.w
		FROM (SELECT c.k COLLATE "C" AS k, sum(c.w) AS w FROM c WHERE c.judged
		      GROUP BY 1 ORDER BY 1) g
		WHERE x.key = g.k AND x.waiting = 0 AND x.in_flight + g.w <= x."limit"
		  AND (SELECT count(*) FROM live) >= 0
		RETURNING x.key),
	a AS MATERIALIZED (
		-- each member beside its quota's verdict: the members and the
		-- updated keys, sorted by key
		SELECT v.* FROM (
			SELECT u.i, u.id, u.sess, u.replica, u.ool, u.intent, u.actor, u.k, u.w,
			       u.judged AND bool_or(u.updated) OVER (PARTITION BY u.k) AS admitted
			FROM (SELECT c.i, c.id, c.sess, c.replica, c.ool, c.intent, c.actor, c.k, c.w,
				     c.judged, false AS updated
			      FROM c
			      UNION ALL
			      SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, upd.key COLLATE "default",
				     NULL, false, true
			      FROM upd) u) v
		WHERE v.i IS NOT NULL),
	t AS MATERIALIZED (
		-- tokens and admission events drawn in arrival order (volatile
		-- output is computed after the sort), under the quota rows' locks
		SELECT a.*,
		       CASE WHEN a.admitted THEN nextval('pgcoord.token_seq') END AS token,
		       CASE WHEN a.admitted THEN nextval('pgcoord.permit_events_id_seq') END
			AS admit_event
		FROM a ORDER BY a.i),
	ins AS (
		INSERT INTO pgcoord.permits (id, token, owner_session, owner_replica, state, phase,
			on_owner_loss, intent, quota_key, quota_weight, admit_event, admit_actor)
		SELECT t.id, t.token, t.sess, t.replica, 'held', 'reserved', t.ool, t.intent, t.k,
		       t.w, t.admit_event, t.actor
		FROM t WHERE t.admitted)
	SELECT t.i,
	       CASE WHEN NOT t.admitted THEN 'PCSLW' END,
	       CASE WHEN NOT t.admitted THEN 'judged by permit_claim_group' END,
	       CASE WHEN t.admitted THEN 'admitted' END::pgcoord.claim_status,
	       t.token,
	       CASE WHEN t.admitted THEN 'held' END,
	       CASE WHEN t.admitted THEN 'reserved' END,
	       CASE WHEN t.admitted THEN t.sess END,
	       CASE WHEN t.admitted THEN t.replica END,
	       CASE WHEN t.admitted THEN (extract(epoch FROM now()) * 1000)::bigint END,
	       NULL::bigint, NULL::text, NULL::integer, NULL::bigint,
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
		-- the members, each with the quota and weight of its permit when
		-- that is a held one-quota permit of its session (read by id, no
		-- lock; the state test is written so that it does not imply the
		-- predicate of permits_open_by_owner, which would let the plan walk
		-- every open permit)
		SELECT u.i::integer AS i, u.id, u.uid, u.sess, u.actor, x.quota_key AS k,
		       x.quota_weight AS w
		FROM (SELECT u.*,
			     coalesce(u.override IS FALSE AND u.reason IS NULL AND u.sess IS NOT NULL
				      AND count(*) OVER (PARTITION BY u.id) = 1, false) AS ok
		      FROM unnest(p_ids, p_uids, p_sessions, p_overrides, p_actors, p_reasons)
			WITH ORDINALITY AS u(id, uid, sess, override, actor, reason, i)) u
		LEFT JOIN LATERAL (
			SELECT x.quota_key, x.quota_weight FROM pgcoord.permits x
			WHERE x.id = u.id AND u.ok AND x.released_at IS NULL
			  AND x.state IS NOT DISTINCT FROM 'held' AND x.quota_key IS NOT NULL
			  AND x.owner_session = u.sess
			  -- session_owner_uid written out (no SECURITY DEFINER call
			  -- per member); the owner and its uid never change
			  AND (SELECT s.owner_uid FROM pgcoord.sessions s
			       WHERE s.id = x.owner_session) IS NOT DISTINCT FROM u.uid
			OFFSET 0) x ON true),
	u AS (
		-- their quota rows, decremented in key order before any permit row
		UPDATE pgcoord.quotas x SET in_flight = x.in_flight - g.w
		FROM (SELECT m.k COLLATE "C" AS k, sum(m.w) AS w FROM m WHERE m.k IS NOT NULL
		      GROUP BY 1 ORDER BY 1) g
		WHERE x.key = g.k
		RETURNING x.key),
	r AS (
		-- the guard of permit_release_group's UPDATE (its uid test in m),
		-- probed by id; the array of decremented keys is an init plan, so every quota row is
		-- written before the first permit row is locked
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
		  AND p.quota_key = ANY ((SELECT array_agg(u.key) FROM u)::text[])
		RETURNING m.i, p.id, p.phase, p.owner_replica, m.actor, p.quota_key,
			p.quota_weight, p.release_event),
	e AS (
		-- a permit whose admission is not in its row (admitted before 0016,
		-- or without an actor) has its release in the log
		INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor,
			state, phase)
		SELECT r.id, r.quota_key, -r.quota_weight, 'released',
		       coalesce(r.actor, 'agent@' || coalesce(r.owner_replica, '?')),
		       'released', r.phase
		FROM r WHERE r.release_event IS NULL ORDER BY r.i)
	SELECT d.i,
	       CASE WHEN NOT d.released THEN 'PCSLW' END,
	       CASE WHEN NOT d.released THEN 'judged by permit_release_group' END,
	       CASE WHEN d.released THEN 'released' END::pgcoord.release_status,
	       CASE WHEN d.released THEN 'released' END,
	       CASE WHEN d.released THEN (extract(epoch FROM now()) * 1000)::bigint END,
	       (extract(epoch FROM now()) * 1000)::bigint
	FROM (SELECT v.i, bool_or(v.released) AS released
	      FROM (SELECT r.i, true AS released FROM r
		    UNION ALL
		    SELECT m.i, false FROM m) v
	      GROUP BY v.i) d
	-- every permit decremented above was released, or all of it goes back
	WHERE CASE WHEN (SELECT count(*) FROM r) = (SELECT count(*) FROM m WHERE m.k IS NOT NULL)
		THEN true
		ELSE pgcoord.changed_meanwhile('a permit of this group of releases changed '
					       'while its quota row was written')
	      END
	ORDER BY d.i;
END $$;

SELECT pgcoord.secure_functions();
