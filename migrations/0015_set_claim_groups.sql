-- Set-based claim groups (issue 10): a claim group of several members in a
-- fixed handful of statements, with the same answers, permit rows, shares,
-- counters and audit rows as its members made one at a time (0012).
--
-- A group of n used to run n permit_claim_as calls, each in a
-- subtransaction of its own: n subtransactions, and n updates of a quota
-- row that many of them name (a hot key). Now the common member (a fresh
-- id, named once in the group, valid sorted keys and weights, no per-call
-- limit) is judged in memory:
--
--   1. the session rows are locked (session_lock_live, in session order);
--      a member whose session is not live is answered session_expired;
--   2. the permit rows of the others go in first, one multi-row insert in
--      arrival order (the presence guard of 0012, and fencing tokens drawn
--      in arrival order, a denied claim's too, as a lone claim does);
--   3. every quota row they name is locked once, in key order;
--   4. the members are judged in arrival order against counters held in
--      memory, by 0012's predicate (every key has room for its weight and
--      nobody waits on it; a key with no quota row: unknown_quota, at the
--      first refusing key in key order, with that quota's numbers then);
--   5. one UPDATE per quota row by the net weight admitted on it, the
--      denied members' permit rows out, the shares and audit rows of the
--      admitted ones in one insert each.
-- A quota with waiters admits no member in 4., so the UPDATE in 5. never
-- raises a row that has waiters: quotas_no_overtaking (0013) never skips
-- it, and never needs to.
--
-- Every other member (an id that exists: a retry, a retired id; an id the
-- group names twice; a per-call limit; input a lone call refuses or fails
-- on) is judged by permit_claim_as (0006) in a subtransaction of its own,
-- as in 0010, after the set-based members. Why that gives the answers of
-- arrival order: a claim's answer and writes depend only on the rows of
-- its id, the quota rows of its keys and whether its session is live. The
-- ids of the two parts differ (an id named twice goes alone, both times);
-- a session that was live stays live until commit (its row is locked) and
-- one that was not never comes back; and a set-based member that names a
-- key some member judged alone names is judged alone as well (the closure
-- below), so the two parts share no quota row. Within each part the order
-- is arrival order. Fencing tokens are in arrival order among members that
-- share a quota, which is where they are compared.
--
-- Input that does not parse (an array literal of keys or weights) sends
-- the whole group through 0010's loop, and so does an id that a claim in
-- flight elsewhere inserted between our look and our insert (the insert
-- skipped it: its rows are taken out again first). Both are rare.
--
-- Locks: session rows, then permit rows, then quota rows in key order, as
-- 0003; the quota rows of the whole set-based part in one key order, so
-- two groups on shared hot keys no longer lock them in their members'
-- arrival orders. An error in the set-based part (a deadlock with a
-- duplicate of one of its ids in flight elsewhere, a lock_timeout) fails
-- the statement, which the agent answers for every member as a failed
-- group (retry).

-- The members p_members of a claim group, each by permit_claim_as in a
-- subtransaction of its own, in the order given (0010's loop).
CREATE FUNCTION pgcoord.permit_claim_members(p_members integer[], p_uids bigint[],
	p_admins boolean[], p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[],
	p_replicas text[], p_on_owner_loss text[], p_intents bytea[], p_limits integer[],
	p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text, status text, token bigint,
	state text, phase text, owner_session bigint, owner_replica text, created_at bigint,
	released_at bigint, denied_key text, denied_limit integer, denied_in_flight bigint,
	detail text, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	i integer;
BEGIN
	FOREACH i IN ARRAY coalesce(p_members, '{}') LOOP
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

CREATE OR REPLACE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[],
	p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[], p_replicas text[],
	p_on_owner_loss text[], p_intents bytea[], p_limits integer[], p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text, status text, token bigint,
	state text, phase text, owner_session bigint, owner_replica text, created_at bigint,
	released_at bigint, denied_key text, denied_limit integer, denied_in_flight bigint,
	detail text, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
	v_n integer := coalesce(cardinality(p_ids), 0);
	v_all integer[] := ARRAY(SELECT generate_series(1, v_n));
	v_set integer[];     -- members judged in memory, arrival order
	v_alone integer[];   -- members judged by permit_claim_as, after
	v_alone_keys text[]; -- the keys those may touch
	v_live bigint[];
	v_dead integer[];
	v_more integer[];
	v_ins_ids text[];
	v_ins_tokens bigint[];
	v_qk text[];
	v_ql integer[];
	v_qf bigint[];
	v_qw integer[];
	v_adm integer[] := '{}';
	v_den integer[] := '{}';
	v_den_key text[] := '{}';
	v_den_limit integer[] := '{}';
	v_den_in_flight bigint[] := '{}';
	v_k text[];
	v_w integer[];
	v_dk text;
	v_pos integer;
	i integer;
	j integer;
BEGIN
	IF v_n = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, c.*
		FROM pgcoord.permit_claim_as(p_uids[1], p_admins[1], p_ids[1],
			p_keys[1]::text[], p_weights[1]::integer[], p_sessions[1], p_replicas[1],
			p_on_owner_loss[1], p_intents[1], p_limits[1], p_actors[1]) c;
		RETURN;
	END IF;
	BEGIN
		PERFORM count(*) FROM unnest(p_keys, p_weights) AS m(k, w)
		WHERE cardinality(m.k::text[]) + cardinality(m.w::integer[]) IS NULL;
	EXCEPTION WHEN OTHERS THEN
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(v_all, p_uids, p_admins,
			p_ids, p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents,
			p_limits, p_actors);
		RETURN;
	END;

	-- the common members, in arrival order (see above)
	v_set := ARRAY(
		SELECT m.i FROM unnest(p_ids, p_keys, p_weights, p_limits, p_on_owner_loss,
				      p_intents, p_actors) WITH ORDINALITY
			AS m(id, k, w, lim, ool, intent, actor, i)
		WHERE m.i <= v_n AND m.lim IS NULL AND octet_length(m.id) BETWEEN 1 AND 200
		  AND m.ool IN ('uncertain', 'release') AND m.actor IS NOT NULL
		  AND coalesce(octet_length(m.intent), 0) <= 65536
		  AND cardinality(m.k::text[]) >= 1
		  AND cardinality(m.k::text[]) = cardinality(m.w::integer[])
		  AND array_position(m.k::text[], NULL) IS NULL
		  AND m.k::text[] = ARRAY(SELECT DISTINCT x COLLATE "C" FROM unnest(m.k::text[]) AS x
					  ORDER BY 1)
		  AND 1 <= ALL (m.w::integer[])
		  AND (SELECT count(*) FROM unnest(p_ids) AS d WHERE d = m.id) = 1
		  AND NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = m.id)
		ORDER BY m.i);

	v_live := ARRAY(SELECT s FROM (SELECT DISTINCT p_sessions[i] AS s FROM unnest(v_set) AS i
				      WHERE p_sessions[i] IS NOT NULL ORDER BY 1) d
			WHERE pgcoord.session_lock_live(d.s));
	v_dead := ARRAY(SELECT i FROM unnest(v_set) AS i
			WHERE NOT coalesce(p_sessions[i] = ANY (v_live), false));
	v_alone := ARRAY(SELECT unnest(v_all) EXCEPT SELECT unnest(v_set) ORDER BY 1);
	v_set := ARRAY(SELECT i FROM unnest(v_set) WITH ORDINALITY AS s(i, o)
		       WHERE i <> ALL (v_dead) ORDER BY o);

	-- the closure: nobody judged in memory shares a quota with a member
	-- judged alone
	v_alone_keys := ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[]) FROM unnest(v_alone) AS i);
	LOOP
		v_more := ARRAY(SELECT i FROM unnest(v_set) AS i
				WHERE p_keys[i]::text[] && v_alone_keys);
		EXIT WHEN cardinality(v_more) = 0;
		v_alone := ARRAY(SELECT unnest(v_alone || v_more) ORDER BY 1);
		v_set := ARRAY(SELECT i FROM unnest(v_set) WITH ORDINALITY AS s(i, o)
			       WHERE i <> ALL (v_more) ORDER BY o);
		v_alone_keys := v_alone_keys
			|| ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[]) FROM unnest(v_more) AS i);
	END LOOP;

	-- the presence guard, and the tokens in arrival order
	WITH ins AS (
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, intent)
		SELECT p_ids[s.i], nextval('pgcoord.token_seq'), p_sessions[s.i], p_replicas[s.i],
		       'held', 'reserved', p_on_owner_loss[s.i], p_intents[s.i]
		FROM (SELECT s.i FROM unnest(v_set) WITH ORDINALITY AS s(i, o) ORDER BY s.o) s
		ON CONFLICT (id) DO NOTHING
		RETURNING p.id, p.token)
	SELECT coalesce(array_agg(ins.id), '{}'), coalesce(array_agg(ins.token), '{}')
	INTO v_ins_ids, v_ins_tokens FROM ins;
	IF cardinality(v_ins_ids) <> cardinality(v_set) THEN
		-- an id claimed meanwhile elsewhere: the whole group alone
		DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ins_ids);
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(v_all, p_uids, p_admins,
			p_ids, p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents,
			p_limits, p_actors);
		RETURN;
	END IF;

	SELECT array_agg(q.key ORDER BY q.key), array_agg(q."limit" ORDER BY q.key),
	       array_agg(q.in_flight ORDER BY q.key), array_agg(q.waiting ORDER BY q.key)
	INTO v_qk, v_ql, v_qf, v_qw
	FROM (SELECT q.key, q."limit", q.in_flight, q.waiting FROM pgcoord.quotas q
	      WHERE q.key = ANY (ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
				       FROM unnest(v_set) AS i))
	      ORDER BY q.key FOR NO KEY UPDATE OF q) q;

	-- judged in arrival order, each against what the ones before it took
	FOREACH i IN ARRAY v_set LOOP
		v_k := p_keys[i]::text[];
		v_w := p_weights[i]::integer[];
		v_dk := NULL;
		FOR j IN 1 .. cardinality(v_k) LOOP
			v_pos := array_position(v_qk, v_k[j]);
			IF v_pos IS NULL OR NOT (v_qf[v_pos] + v_w[j] <= v_ql[v_pos]
						 AND v_qw[v_pos] = 0) THEN
				v_dk := v_k[j];
				EXIT;
			END IF;
		END LOOP;
		IF v_dk IS NULL THEN
			FOR j IN 1 .. cardinality(v_k) LOOP
				v_pos := array_position(v_qk, v_k[j]);
				v_qf[v_pos] := v_qf[v_pos] + v_w[j];
			END LOOP;
			v_adm := v_adm || i;
		ELSE
			v_den := v_den || i;
			v_den_key := v_den_key || v_dk;
			v_den_limit := v_den_limit || v_ql[v_pos];
			v_den_in_flight := v_den_in_flight || v_qf[v_pos];
		END IF;
	END LOOP;

	UPDATE pgcoord.quotas q SET in_flight = q.in_flight + t.w
	FROM (SELECT a.k, sum(a.w) AS w
	      FROM unnest(v_adm) AS i, unnest(p_keys[i]::text[], p_weights[i]::integer[]) AS a(k, w)
	      GROUP BY a.k) t
	WHERE q.key = t.k;
	IF cardinality(v_den) > 0 THEN
		DELETE FROM pgcoord.permits p
		WHERE p.id = ANY (ARRAY(SELECT p_ids[i] FROM unnest(v_den) AS i));
	END IF;
	INSERT INTO pgcoord.permit_quotas (permit_id, key, weight)
	SELECT p_ids[i], a.k, a.w
	FROM unnest(v_adm) AS i, unnest(p_keys[i]::text[], p_weights[i]::integer[]) AS a(k, w);
	INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, state, phase)
	SELECT p_ids[s.i], a.k, a.w, 'admitted', p_actors[s.i], 'held', 'reserved'
	FROM unnest(v_adm) WITH ORDINALITY AS s(i, o)
	CROSS JOIN LATERAL unnest(p_keys[s.i]::text[], p_weights[s.i]::integer[]) AS a(k, w)
	ORDER BY s.o, a.k COLLATE "C";

	RETURN QUERY
	SELECT i, NULL::text, NULL::text, 'admitted'::text,
	       v_ins_tokens[array_position(v_ins_ids, p_ids[i])], 'held'::text, 'reserved'::text,
	       p_sessions[i], p_replicas[i], pgcoord.ms(now()), NULL::bigint, NULL::text,
	       NULL::integer, NULL::bigint, NULL::text, pgcoord.ms(now())
	FROM unnest(v_adm) AS i
	UNION ALL
	SELECT d.i, NULL, NULL, CASE WHEN d.lim IS NULL THEN 'unknown_quota' ELSE 'denied' END,
	       NULL, NULL, NULL, NULL, NULL, NULL, NULL, d.k, d.lim, d.f, NULL, pgcoord.ms(now())
	FROM unnest(v_den, v_den_key, v_den_limit, v_den_in_flight) AS d(i, k, lim, f)
	UNION ALL
	SELECT i, NULL, NULL, 'session_expired', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
	       NULL, NULL, NULL, pgcoord.ms(now())
	FROM unnest(v_dead) AS i;

	RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(v_alone, p_uids, p_admins, p_ids,
		p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
		p_actors);
END $$;

SELECT pgcoord.secure_functions();
