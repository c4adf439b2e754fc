-- Who holds a quota's room (quota.why, `pgcoordctl why`): the quota's
-- numbers, the head of its queue, and its open permits: the largest, the
-- longest held and the uncertain ones, at most p_limit of each.
--
-- A permit's details (id, owner, state, reason) go only to the uid it
-- belongs to (its owner session's, as for a claim of its id: 0010) or to
-- an admin; the others are counted in `hidden`, so a tenant learns how
-- full a quota is without learning who else runs what. The same holds for
-- the queue's head (a waiter belongs to the uid that queued it).
--
-- No index leads from a key to its permits (a claim writes none: 0004), so
-- this reads every open permit through permits_open_by_owner. It answers
-- an operator's question, once; it is never on the claim path.
--
-- One row with part = 'quota' (the numbers; the holder columns NULL), then
-- one row per holder and list it is in ('largest', 'oldest', 'uncertain';
-- a holder may be in several). No row at all when the quota does not exist.
CREATE FUNCTION pgcoord.quota_why(p_key text, p_uid bigint, p_admin boolean, p_limit integer)
RETURNS TABLE (part text, key text, "limit" integer, in_flight bigint, waiting integer,
	holders bigint, hidden bigint, uncertain_weight bigint, head_id text, head_weight integer,
	head_waited_ms bigint, id text, weight integer, state text, phase text,
	owner_replica text, owner_session bigint, held_ms bigint, state_ms bigint, reason text,
	now_at bigint)
LANGUAGE sql STABLE AS $$
	WITH q AS (
		SELECT q.key::text AS key, q."limit"::integer AS lim, q.in_flight::bigint AS in_flight,
		       q.waiting
		FROM pgcoord.quotas q WHERE q.key = p_key
	), holder AS (
		SELECT p.id::text AS id, pq.weight, p.effective_state::text AS state,
		       p.phase::text AS phase, p.owner_replica, p.owner_session, p.created_at,
		       p.state_at, p.effective_reason AS reason,
		       p_admin OR (p_uid IS NOT NULL AND s.owner_uid = p_uid) AS visible
		FROM pgcoord.permit_status p
		JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id AND pq.key = p_key
		LEFT JOIN pgcoord.sessions s ON s.id = p.owner_session
		WHERE p.state <> 'released'
	), head AS (
		SELECT CASE WHEN p_admin OR (p_uid IS NOT NULL AND w.uid = p_uid) THEN w.id::text END
			   AS id,
		       w.weights[array_position(w.keys, p_key::text)] AS weight, w.queued_at
		FROM pgcoord.waiters w
		WHERE w.state = 'queued' AND p_key::text = ANY (w.keys)
		ORDER BY w.seq LIMIT 1
	), t AS (
		SELECT pgcoord.ms(now()) AS now_ms
	)
	SELECT 'quota', q.key, q.lim, q.in_flight, q.waiting,
	       (SELECT count(*) FROM holder), (SELECT count(*) FROM holder WHERE NOT visible),
	       (SELECT coalesce(sum(weight), 0) FROM holder WHERE state = 'uncertain'),
	       h.id, h.weight, t.now_ms - pgcoord.ms(h.queued_at),
	       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, t.now_ms
	FROM q CROSS JOIN t LEFT JOIN head h ON true
	UNION ALL
	SELECT l.part, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
	       l.id, l.weight, l.state, l.phase, l.owner_replica, l.owner_session,
	       t.now_ms - pgcoord.ms(l.created_at), t.now_ms - pgcoord.ms(l.state_at), l.reason,
	       t.now_ms
	FROM t, (
		(SELECT 'largest' AS part, h.* FROM holder h WHERE h.visible AND EXISTS (SELECT 1 FROM q)
		 ORDER BY h.weight DESC, h.created_at, h.id LIMIT p_limit)
		UNION ALL
		(SELECT 'oldest', h.* FROM holder h WHERE h.visible AND EXISTS (SELECT 1 FROM q)
		 ORDER BY h.created_at, h.id LIMIT p_limit)
		UNION ALL
		(SELECT 'uncertain', h.* FROM holder h
		 WHERE h.visible AND h.state = 'uncertain' AND EXISTS (SELECT 1 FROM q)
		 ORDER BY h.state_at, h.id LIMIT p_limit)
	) l
$$;

SELECT pgcoord.secure_functions();
