-- BROKEN ON PURPOSE (test builds only): recovery without the liveness
-- check. Every open record of another session is a candidate, and it is
-- adopted whether or not its owner's death was made final: a booting
-- replica takes a living replica's work (guarantee 8). The soak checker must
-- report recovery_dead_only.
-- @function pgcoord.record_recover
-- @replace
		AND NOT pgcoord.session_is_live(r.owner_session)
-- @with
		AND r.owner_session <> p_session
-- @end
-- @replace
			  AND r.owner_session = ANY (v_dead) AND NOT r.terminal
-- @with
			  AND NOT r.terminal
-- @end
