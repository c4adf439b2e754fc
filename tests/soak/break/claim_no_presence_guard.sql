-- BROKEN ON PURPOSE (test builds only): the claim's counter arm is not
-- guarded on the permit's absence. A retry of an id that already has a
-- permit (a lost reply, a duplicate delivery) answers the original grant
-- but counts it again: the permanent phantom of the seed's pre-fix shape
-- (guarantees 2 and 3). The soak checker must report admitted_once.
-- @function pgcoord.permit_claim_as
-- @replace
	IF v_inserted THEN
		-- the per-call limit applies to this very admission, and stays
-- @with
	IF true THEN
		-- the per-call limit applies to this very admission, and stays
-- @end
-- @replace
				INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
				SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w))
-- @with
				INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
				SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w)
				ON CONFLICT DO NOTHING)
-- @end
