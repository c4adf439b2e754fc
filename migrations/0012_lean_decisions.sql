-- A lean decision layer (issue 10): the same answers, guarantees and audit
-- rows as 0003/0010, for less database work per claim and release.
--
-- 1. No subtransaction on a claim's common path. A claim used to run its
--    counter updates in an EXCEPTION block so a denial could roll them
--    back; each such block is a subtransaction (its own xid, WAL and lock
--    bookkeeping) on every claim, admitted or not. Now a denial undoes
--    by hand what the claim did before it: the increments of the keys
--    before the one that refused, and the permit row it inserted. The
--    permit's shares and admission audit rows are written only once every
--    quota admitted it, one multi-row insert each.
-- 2. A group of one, the common case at low concurrency, is judged by the
--    single call itself, without a subtransaction: an error it raises
--    fails the statement, which the agent answers as it would a lone call
--    (a lone call cannot meet the cross-group deadlock the members'
--    subtransactions exist for). A release group of one takes no group
--    lock first: the release locks the same rows, in the same order.
-- 3. Quota rows are updated on every claim and release and no index covers
--    in_flight: with room left on their page those updates are HOT (no
--    index entries, less WAL). Quota rows get that room.
-- 4. Waiting claims (waiting, maintained where claims queue and are handed
--    slots): an immediate claim admits only while nobody waits on any of
--    its quotas, so nobody overtakes a queue; otherwise it is denied with
--    that quota's numbers.

ALTER TABLE pgcoord.quotas ADD COLUMN IF NOT EXISTS waiting integer NOT NULL DEFAULT 0;
ALTER TABLE pgcoord.quotas SET (fillfactor = 50);

-- As in 0003, without the subtransaction (see 1. above). Lock order is
-- unchanged: session row, the new permit row, then quota rows in key order.
CREATE OR REPLACE FUNCTION pgcoord.permit_claim(p_id text, p_keys text[], p_weights integer[],
	p_session bigint, p_replica text, p_on_owner_loss text, p_intent bytea,
	p_limit integer, p_actor text)
RETURNS TABLE (status text, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, detail text, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_p pgcoord.permits;
	v_key text;
	v_w integer;
	v_inserted boolean := false;
	v_denied_key text;
	v_denied_limit integer;
	v_denied_in_flight bigint;
	v_quotas text;
BEGIN
	IF cardinality(p_keys) IS NULL OR cardinality(p_keys) <> cardinality(p_weights)
	   OR p_keys <> ARRAY(SELECT DISTINCT k COLLATE "C" FROM unnest(p_keys) AS k ORDER BY 1)
	   OR (p_limit IS NOT NULL AND cardinality(p_keys) <> 1) THEN
		RETURN QUERY SELECT 'invalid', NULL::bigint, NULL, NULL, NULL::bigint, NULL,
			NULL::bigint, NULL::bigint, NULL, NULL::integer, NULL::bigint,
			'keys must be distinct and sorted; a limit needs exactly one quota',
			pgcoord.ms(now());
		RETURN;
	END IF;
	IF NOT pgcoord.session_lock_live(p_session) THEN
		RETURN QUERY SELECT 'session_expired', NULL::bigint, NULL, NULL, NULL::bigint,
			NULL, NULL::bigint, NULL::bigint, NULL, NULL::integer, NULL::bigint,
			NULL, pgcoord.ms(now());
		RETURN;
	END IF;
	-- The presence guard (guarantee 3): the permit row goes in first. A
	-- duplicate that races us waits here on our insert and then finds the
	-- row (or, if we were denied, its absence), so a lost-reply retry or a
	-- double delivery can never reach the counters a second time.
	INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
		phase, on_owner_loss, intent)
	VALUES (p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
		'reserved', p_on_owner_loss, p_intent)
	ON CONFLICT (id) DO NOTHING
	RETURNING * INTO v_p;
	v_inserted := FOUND;
	IF v_inserted THEN
		-- the per-call limit applies to this very admission, and stays
		-- recorded if the claim is denied: it is the caller's current
		-- word on the quota, not part of the grant. A retry of an
		-- existing id changes nothing, limit included.
		IF p_limit IS NOT NULL THEN
			PERFORM pgcoord.quota_apply(p_keys[1], p_limit, NULL, p_actor,
				'claim ' || p_id);
		END IF;
		-- Guarantee 1: one conditional UPDATE per quota, in key order;
		-- Postgres re-checks the predicate on the latest row version
		-- under the row lock, so admissions on one quota serialize and
		-- never overshoot, on any agent.
		FOR v_key, v_w IN
			SELECT t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w)
			ORDER BY t.k COLLATE "C"
		LOOP
			UPDATE pgcoord.quotas q SET in_flight = q.in_flight + v_w
			WHERE q.key = v_key AND q.in_flight + v_w <= q."limit" AND q.waiting = 0;
			IF NOT FOUND THEN
				v_denied_key := v_key;
				SELECT q."limit", q.in_flight INTO v_denied_limit, v_denied_in_flight
				FROM pgcoord.quotas q WHERE q.key = v_key;
				EXIT;
			END IF;
		END LOOP;
		IF v_denied_key IS NOT NULL THEN
			-- all or nothing: give back the keys before the refusing
			-- one (still locked by us) and take the permit row out
			FOR v_key, v_w IN
				SELECT t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w)
				WHERE t.k COLLATE "C" < v_denied_key ORDER BY t.k COLLATE "C"
			LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight - v_w
				WHERE q.key = v_key;
			END LOOP;
			DELETE FROM pgcoord.permits p WHERE p.id = p_id AND p.token = v_p.token;
			v_inserted := false;
		ELSE
			INSERT INTO pgcoord.permit_quotas (permit_id, key, weight)
			SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w);
			INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, t.k, t.w, 'admitted', p_actor, 'held', 'reserved'
			FROM unnest(p_keys, p_weights) AS t(k, w) ORDER BY t.k COLLATE "C";
		END IF;
	END IF;

	IF v_denied_key IS NOT NULL THEN
		RETURN QUERY SELECT CASE WHEN v_denied_limit IS NULL THEN 'unknown_quota'
				    ELSE 'denied' END,
			NULL::bigint, NULL, NULL, NULL::bigint, NULL, NULL::bigint, NULL::bigint,
			v_denied_key, v_denied_limit, v_denied_in_flight, NULL, pgcoord.ms(now());
		RETURN;
	END IF;
	IF v_inserted THEN
		RETURN QUERY SELECT 'admitted', v_p.token, v_p.state, v_p.phase, v_p.owner_session,
			v_p.owner_replica, pgcoord.ms(v_p.created_at), NULL::bigint, NULL,
			NULL::integer, NULL::bigint, NULL, pgcoord.ms(now());
		RETURN;
	END IF;

	-- The id exists (committed: ON CONFLICT waited for its inserter).
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id;
	SELECT string_agg(pq.key || ':' || pq.weight, ',' ORDER BY pq.key) INTO v_quotas
	FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p_id;
	IF v_p.state = 'released' THEN
		RETURN QUERY SELECT 'released', v_p.token, v_p.state, v_p.phase, v_p.owner_session,
			v_p.owner_replica, pgcoord.ms(v_p.created_at), pgcoord.ms(v_p.released_at),
			NULL, NULL::integer, NULL::bigint, v_quotas, pgcoord.ms(now());
		RETURN;
	END IF;
	IF v_quotas IS DISTINCT FROM (SELECT string_agg(t.k || ':' || t.w, ',' ORDER BY t.k COLLATE "C")
				      FROM unnest(p_keys, p_weights) AS t(k, w)) THEN
		RETURN QUERY SELECT 'mismatch', v_p.token, v_p.state, v_p.phase, v_p.owner_session,
			v_p.owner_replica, pgcoord.ms(v_p.created_at), NULL::bigint, NULL,
			NULL::integer, NULL::bigint, v_quotas, pgcoord.ms(now());
		RETURN;
	END IF;
	RETURN QUERY SELECT 'held', v_p.token, s.effective_state, v_p.phase, v_p.owner_session,
		v_p.owner_replica, pgcoord.ms(v_p.created_at), NULL::bigint, NULL, NULL::integer,
		NULL::bigint, NULL, pgcoord.ms(now())
	FROM pgcoord.permit_status s WHERE s.id = p_id;
END $$;

-- As in 0010; a group of one is the single call, without a subtransaction
-- (see 2. above).
CREATE OR REPLACE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[],
	p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[], p_replicas text[],
	p_on_owner_loss text[], p_intents bytea[], p_limits integer[], p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text, status text, token bigint,
	state text, phase text, owner_session bigint, owner_replica text, created_at bigint,
	released_at bigint, denied_key text, denied_limit integer, denied_in_flight bigint,
	detail text, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	i integer;
BEGIN
	IF cardinality(p_ids) = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, c.*
		FROM pgcoord.permit_claim_as(p_uids[1], p_admins[1], p_ids[1],
			p_keys[1]::text[], p_weights[1]::integer[], p_sessions[1], p_replicas[1],
			p_on_owner_loss[1], p_intents[1], p_limits[1], p_actors[1]) c;
		RETURN;
	END IF;
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

-- As in 0010; a group of one is the single release, which locks its quota
-- rows itself, without a subtransaction (see 2. above).
CREATE OR REPLACE FUNCTION pgcoord.permit_release_group(p_uids bigint[], p_ids text[],
	p_sessions bigint[], p_overrides boolean[], p_actors text[], p_reasons text[])
RETURNS TABLE (member integer, err_state text, err_message text, outcome text, detail text,
	released boolean, state text, released_at bigint, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	i integer;
BEGIN
	IF cardinality(p_ids) = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, r.*
		FROM pgcoord.permit_release_as(p_uids[1], p_ids[1], p_sessions[1],
			p_overrides[1], p_actors[1], p_reasons[1]) r;
		RETURN;
	END IF;
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

-- The functions replaced above lost SECURITY DEFINER and the pinned
-- search_path; secure them in this migration's own transaction (as 0008).
SELECT pgcoord.secure_functions();
