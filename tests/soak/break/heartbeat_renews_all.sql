-- BROKEN ON PURPOSE (test builds only): the heartbeat keeps every attached
-- session of the agent's incarnation live, not only those the agent still
-- lists. A session the agent declared lost for a missed keepalive is never
-- pinned, so it stays live in the database with its agent's row, its
-- permits never follow on_owner_loss and its records are never recovered.
-- The soak checker must report keepalive.
-- @function pgcoord.agent_beat
-- @replace
			v_gone := ARRAY(SELECT unnest(v_known) EXCEPT SELECT unnest(p_sessions));
-- @with
			v_gone := '{}';
-- @end
