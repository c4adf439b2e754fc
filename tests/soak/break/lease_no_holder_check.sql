-- BROKEN ON PURPOSE (test builds only): lease acquisition ignores the
-- holder. Any campaigner takes the lease at once, whoever holds it and
-- however long it has left (guarantee 7): two sessions lead at the same
-- time. The soak checker must report one_leader.
-- @function pgcoord.lease_acquire
-- @replace
	IF FOUND THEN
		RETURN v_result;
	END IF;
	IF pgcoord.session_lock_live(p_session) THEN
-- @with
	IF pgcoord.session_lock_live(p_session) THEN
-- @end
-- @replace
		IF NOT (FOUND AND v_prev_session IS DISTINCT FROM p_session
			AND v_prev_session IS NOT NULL AND v_prev_expires > now()) THEN
-- @with
		IF true THEN
-- @end
-- @replace
			WHERE l.holder_session = p_session OR l.holder_session IS NULL
			   OR v_prev_expires <= now()
-- @with
-- @end
