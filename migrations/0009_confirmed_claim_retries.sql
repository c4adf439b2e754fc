-- A claim retry answers only what the synchronous standby has (issue 14).
--
-- When a commit's wait for the synchronous standby is cancelled (a cancel,
-- a terminated backend, a statement_timeout), PostgreSQL keeps it on the
-- primary, visible to everyone, though the standby a failover would promote
-- may not have it. The agent does not acknowledge such a commit (it answers
-- retryably); but a retry of the same permit id used to read the permit and
-- answer `held` in a read-only transaction, whose commit waits for nobody:
-- the client was then told of a grant the standby might not have.
--
-- Now the retry writes the permit row it found (an update that changes
-- nothing but is logged), so its own commit waits for the synchronous
-- standby to confirm WAL up to that point, which covers the earlier commit:
-- the answer `held` (or `released`, `mismatch`) comes only once the standby
-- has the permit. One row lock and one WAL record per retry; a first claim
-- is unchanged.

CREATE OR REPLACE FUNCTION pgcoord.permit_claim_as(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text)
RETURNS TABLE (status text, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, detail text, now_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_limit integer := p_limit;
	v_r record;
BEGIN
	IF NOT p_admin AND v_limit IS NOT NULL
	   AND EXISTS (SELECT 1 FROM pgcoord.quotas q WHERE q.key = p_keys[1]) THEN
		v_limit := NULL;
	END IF;
	DELETE FROM pgcoord.permits p
	WHERE p.id = p_id AND p.state = 'released'
	  AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p.id)
	  AND pgcoord.session_owner_uid(p.owner_session) IS DISTINCT FROM p_uid;
	IF FOUND THEN
		DELETE FROM pgcoord.permit_events e WHERE e.permit_id = p_id;
	END IF;
	FOR v_r IN SELECT * FROM pgcoord.permit_claim(p_id, p_keys, p_weights, p_session,
		p_replica, p_on_owner_loss, p_intent, v_limit, p_actor)
	LOOP
		-- an answer read from an existing permit: commit a write, so
		-- that the answer waits for the synchronous standby
		IF v_r.status IN ('held', 'released', 'mismatch') THEN
			UPDATE pgcoord.permits p SET id = p.id WHERE p.id = p_id;
		END IF;
		RETURN QUERY SELECT v_r.status, v_r.token, v_r.state, v_r.phase,
			v_r.owner_session, v_r.owner_replica, v_r.created_at, v_r.released_at,
			v_r.denied_key, v_r.denied_limit, v_r.denied_in_flight, v_r.detail,
			v_r.now_at;
	END LOOP;
END $$;

-- CREATE OR REPLACE resets the planner setting 0008 gave it.
ALTER FUNCTION pgcoord.permit_claim_as(bigint, boolean, text, text[], integer[], bigint, text,
	text, bytea, integer, text) SET enable_seqscan = off;

-- The function replaced above lost SECURITY DEFINER and the pinned
-- search_path; secure it in this migration's own transaction, as 0008 does.
SELECT pgcoord.secure_functions();
