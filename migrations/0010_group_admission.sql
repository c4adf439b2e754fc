-- Group admission (issue 10): the claims, or the releases, that wait in one
-- agent at the same moment go to the database as one statement, so they
-- share one transaction and one commit flush.
--
-- Each group function takes one array per argument of its single-call
-- function (element i for member i, in arrival order) and answers one row
-- per member: (member, sqlstate, message) and then exactly the single
-- call's columns. Each member is judged by the single-call function itself
-- (permit_claim_as, permit_release_as), in arrival order, so its answer,
-- its idempotency by id, its audit rows, its fencing token and its uid
-- checks are the ones it would have had alone; a later member sees what an
-- earlier one did, as it would have after that one's commit. Each member
-- runs in a subtransaction of its own: an error it raises (a lock_timeout,
-- a deadlock, a check) rolls back only its own part and comes back as its
-- sqlstate and message. A statement timeout is not caught: the whole group
-- rolls back, and every member is answered `timeout`, as a lone call would
-- have been.
--
-- Locks: each claim member locks as a lone claim does (0003's order: its
-- session row, the permit row it inserts, then its quota rows in key
-- order), and what it locked stays locked until the group commits, so a
-- quota row many members of a group name (a hot key) is locked once, by
-- the first of them. The quota rows are not locked for the whole group
-- up front: that would hold them while a later member's insert waits for
-- a duplicate of its claim in flight through another agent, which waits
-- for those rows. Releases lock every quota row of the group's permits in
-- key order first, as each release does before any permit row.
--
-- Locks now outlive one call, until the group commits, so two groups can
-- still wait on each other where two lone calls could not (members on
-- shared quotas in opposite orders, a duplicate claim in flight in each).
-- Postgres detects it (deadlock_timeout, 1 s by default) and stops one
-- member, whose part alone rolls back (40P01); the agent sends that
-- member again in its next group (groups.c), so its client sees the
-- answer a lone call would have had.

CREATE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[], p_ids text[],
	p_keys text[], p_weights text[], p_sessions bigint[], p_replicas text[],
	p_on_owner_loss text[], p_intents bytea[], p_limits integer[], p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text, status text, token bigint,
	state text, phase text, owner_session bigint, owner_replica text, created_at bigint,
	released_at bigint, denied_key text, denied_limit integer, denied_in_flight bigint,
	detail text, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	i integer;
BEGIN
	FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
		BEGIN
			RETURN QUERY SELECT i, NULL::text, NULL::text, c.*
			FROM pgcoord.permit_claim_as(p_uids[i], p_admins[i], p_ids[i],
				p_keys[i]::text[], p_weights[i]::integer[], p_sessions[i],
				p_replicas[i], p_on_owner_loss[i], p_intents[i], p_limits[i],
				p_actors[i]) c;
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text, NULL::text,
				NULL::bigint, NULL::text, NULL::text, NULL::bigint, NULL::text,
				NULL::bigint, NULL::bigint, NULL::text, NULL::integer, NULL::bigint,
				NULL::text, NULL::bigint;
		END;
	END LOOP;
END $$;

-- Releases lock every quota row their permits hold weight on, in key order,
-- before any permit row (permits_lock_quotas, as each release does).
CREATE FUNCTION pgcoord.permit_release_group(p_uids bigint[], p_ids text[],
	p_sessions bigint[], p_overrides boolean[], p_actors text[], p_reasons text[])
RETURNS TABLE (member integer, err_state text, err_message text, outcome text, detail text,
	released boolean, state text, released_at bigint, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	i integer;
BEGIN
	PERFORM pgcoord.permits_lock_quotas(p_ids);
	FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
		BEGIN
			RETURN QUERY SELECT i, NULL::text, NULL::text, r.*
			FROM pgcoord.permit_release_as(p_uids[i], p_ids[i], p_sessions[i],
				p_overrides[i], p_actors[i], p_reasons[i]) r;
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text, NULL::text,
				NULL::text, NULL::boolean, NULL::text, NULL::bigint, NULL::bigint;
		END;
	END LOOP;
END $$;

-- The heartbeat at scale: one statement per agent per interval whatever its
-- sessions, but the sessions it could not renew were found by testing each
-- against every renewed one, O(n²): with 10,000 sessions on one agent
-- that took seconds, longer than the interval. A set difference (hashed)
-- is O(n). Otherwise as in 0001.
CREATE OR REPLACE FUNCTION pgcoord.agent_heartbeat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[])
RETURNS TABLE (agent_ok boolean, lost bigint[], now_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_renewed bigint[] := '{}';
	v_ok boolean;
BEGIN
	UPDATE pgcoord.agents SET heartbeat_at = now(),
		expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation AND stopped_at IS NULL;
	v_ok := FOUND;
	IF v_ok THEN
		WITH r AS (
			UPDATE pgcoord.sessions s
			SET expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
			WHERE s.id = ANY (p_sessions) AND s.replica_id = p_replica_id
			  AND s.incarnation = p_incarnation
			  AND s.closed_at IS NULL AND s.expires_at > now()
			RETURNING s.id)
		SELECT coalesce(array_agg(id), '{}') INTO v_renewed FROM r;
	END IF;
	RETURN QUERY SELECT v_ok,
		ARRAY(SELECT unnest(p_sessions) EXCEPT SELECT unnest(v_renewed)),
		pgcoord.ms(now());
END $$;

SELECT pgcoord.secure_functions();
