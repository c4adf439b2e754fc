-- BROKEN ON PURPOSE (test builds only): the claim's counter arm is not
-- guarded on the permit's absence. A retry of an id that already has a
-- permit (a lost reply, a duplicate delivery) answers the original grant
-- but counts it again: the permanent phantom of the seed's pre-fix shape
-- (guarantees 2 and 3). The soak checker must report admitted_once.
-- @function pgcoord.permit_claim_as
-- @replace
	v_exists := v_p.id IS NOT NULL;
-- @with
	v_exists := false;
-- @end
-- @replace
		IF v_exists OR v_denied IS NOT NULL THEN
-- @with
		IF v_denied IS NOT NULL THEN
-- @end
