-- BROKEN ON PURPOSE (test builds only): the heartbeat renews every open
-- session of the agent's incarnation, not only those the agent still
-- holds. A session the agent declared lost for a missed keepalive stays
-- live in the database, so its permits never follow on_owner_loss and its
-- records are never recovered. The soak checker must report keepalive.
-- @function pgcoord.agent_heartbeat
-- @replace
			WHERE s.id = ANY (p_sessions) AND s.replica_id = p_replica_id
-- @with
			WHERE s.replica_id = p_replica_id
-- @end
