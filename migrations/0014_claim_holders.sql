-- The quota that keeps a queued claim out, for its answer's holders
-- (the agent then reads quota_why, 0012, for it): the first of the claim's
-- quotas, in key order, without room for its weight; else the first with a
-- waiter queued before it (waiting counts the claim itself); else the
-- first. A denied claim's answer names its quota already and needs none.
-- Reads only the claim's quota rows, by key.
CREATE FUNCTION pgcoord.claim_blocking_key(p_keys text[], p_weights integer[])
RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT t.k
	FROM unnest(p_keys, p_weights) AS t(k, w)
	JOIN pgcoord.quotas q ON q.key = t.k
	ORDER BY q.in_flight + t.w > q."limit" DESC, q.waiting > 1 DESC, t.k
	LIMIT 1
$$;

SELECT pgcoord.secure_functions();
