-- BROKEN ON PURPOSE (test builds only): admission by count-then-insert.
-- The claim counts the weights of the quota's open permits in its own
-- snapshot and then adds its weight unconditionally: two claims that count
-- at the same time both see room and both go in (guarantee 1). The soak
-- checker must report quota_limit.
-- @function pgcoord.permit_claim_as
-- @replace
			UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[j]
			WHERE q.key = p_keys[j] AND q.in_flight + p_weights[j] <= q."limit"
			  AND q.waiting = 0;
			IF NOT FOUND THEN
-- @with
			IF (SELECT coalesce(sum(pq.weight), 0) FROM pgcoord.permit_quotas pq
			    JOIN pgcoord.permits p ON p.id = pq.permit_id
			    WHERE pq.key = p_keys[j] AND p.state <> 'released'
			      AND p.id <> p_id) + p_weights[j]
			   <= (SELECT q."limit" FROM pgcoord.quotas q WHERE q.key = p_keys[j]) THEN
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[j]
				WHERE q.key = p_keys[j];
			ELSE
				PERFORM 1 WHERE false; -- FOUND := false: denied
			END IF;
			IF NOT FOUND THEN
-- @end
-- A claim group judged in memory (permit_claim_group) reads the counters
-- without locking their rows first, then adds its net weight
-- unconditionally: two groups that read at the same time both see room.
-- @function pgcoord.permit_claim_group
-- @replace
	      ORDER BY q.key FOR NO KEY UPDATE OF q) q;
-- @with
	      ORDER BY q.key) q;
-- @end
-- The one statement of a claim group (permit_claim_fast) counts the open
-- permits of each quota in its snapshot instead of testing the counter under
-- the row lock: two statements that count at the same time both see room.
-- @function pgcoord.permit_claim_fast
-- @replace
		WHERE x.key = g.k AND x.waiting = 0 AND x.in_flight + g.w <= x."limit"
-- @with
		WHERE x.key = g.k AND x.waiting = 0
		  AND (SELECT coalesce(sum(pq.weight), 0) FROM pgcoord.permit_quotas pq
		       JOIN pgcoord.permits p ON p.id = pq.permit_id
		       WHERE pq.key = g.k AND p.state <> 'released') + g.w <= x."limit"
-- @end
