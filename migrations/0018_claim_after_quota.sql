-- A claim writes its permit row once, after its quota rows.
--
-- Until now a claim inserted its permit row first, as the presence guard
-- of guarantee 3 (a duplicate of the id waited on that insert and then
-- found the row), then took its quota rows, then wrote the row again: its
-- admission event's id must be drawn under the quota rows' locks, so that
-- the ids order each quota's events as they happened (0016). The guard's
-- insert was speculative (ON CONFLICT), which writes a confirmation record
-- beside the row, and the second write was an update of the row. Of a
-- one-quota cycle's 1,091 bytes of WAL (scripts/wal-cycle) those were 154.
--
-- Now the id is first read, not written: an id that has a row answers as
-- before (held, or a conflict), having written nothing. A new id takes its
-- quota rows (the conditional UPDATE of guarantee 1, in key order), and
-- only then, admitted, inserts its permit row, once, with its token and
-- its admission event's id drawn there, under the quota rows' locks. The
-- guard moves from the row to the quota rows: a duplicate of a claim names
-- the same quotas, so it waits on the first one's quota row until that
-- claim commits; it then reads the id again, with a snapshot taken after
-- the lock (a new statement, READ COMMITTED), finds the row, gives its
-- increments back (undone before its commit: nobody saw them) and answers
-- the original grant. A duplicate that names other quotas than the first
-- claim did is refused as before once the first has committed; while both
-- are in flight the second fails on the primary key (unique_violation,
-- retryable) instead of waiting on the first's row. A denial writes
-- nothing but the per-call limit it carried; before, it inserted the row
-- and deleted it. A claim group judges its members in memory as before and
-- inserts the rows of the admitted ones only.
--
-- Lock order is unchanged (sessions, then quotas in key order, then
-- permits); the new permit row is locked by nobody else. The token is
-- drawn under the quota rows' locks too: still strictly increasing with
-- real time from one grant to a later one.
--
-- The upgrade replaces three functions: held, uncertain and queued permits
-- and their history are untouched, and an agent of the previous version
-- calls the same functions with the same arguments.

-- permit.claim: the id read first, the row written after its quotas (above).
CREATE OR REPLACE FUNCTION pgcoord.permit_claim_as(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text)
RETURNS pgcoord.claim_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_d pgcoord.claim_decision;
	v_p pgcoord.permits;
	v_n integer := cardinality(p_keys);
	v_limit integer := p_limit;
	v_exists boolean;
	v_denied integer; -- the subscript of the first key without room
	v_denied_limit integer;
	v_denied_in_flight bigint;
	v_taken integer := 0; -- quotas incremented so far, in key order
	v_quotas text;
	v_owner_uid bigint;
	j integer;
BEGIN
	IF v_limit IS NOT NULL AND NOT p_admin THEN
		IF EXISTS (SELECT 1 FROM pgcoord.quotas q WHERE q.key = p_keys[1]) THEN
			v_limit := NULL;
		END IF;
	END IF;
	IF v_n IS NULL OR v_n <> cardinality(p_weights)
	   OR (v_limit IS NOT NULL AND v_n <> 1) THEN
		RAISE EXCEPTION 'keys must be distinct and sorted; a limit needs exactly one quota'
			USING ERRCODE = 'PCINV';
	END IF;
	-- one key in a plain one-dimensional array is sorted and distinct
	IF v_n > 1 OR array_ndims(p_keys) <> 1 OR array_lower(p_keys, 1) <> 1 THEN
		IF p_keys <> ARRAY(SELECT DISTINCT k COLLATE "C" FROM unnest(p_keys) AS k ORDER BY 1)
		THEN
			RAISE EXCEPTION 'keys must be distinct and sorted; a limit needs exactly one '
				'quota' USING ERRCODE = 'PCINV';
		END IF;
	END IF;
	-- the weights by the keys' subscripts (1..v_n), as unnest pairs them
	IF array_ndims(p_weights) <> 1 OR array_lower(p_weights, 1) <> 1 THEN
		p_weights := ARRAY(SELECT unnest(p_weights));
	END IF;

	-- The session, under FOR KEY SHARE (session_lock_live: a close waits
	-- for this claim or is seen by it), refused before any other answer;
	-- and the id, read in the same statement.
	SELECT p.* INTO v_p FROM pgcoord.sessions s
	LEFT JOIN pgcoord.permits p ON p.id = p_id
	WHERE s.id = p_session AND s.closed_at IS NULL
	  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
	FOR KEY SHARE OF s;
	IF NOT FOUND THEN
		RAISE EXCEPTION USING ERRCODE = 'PCSEX', MESSAGE = pgcoord.claim_session_expired();
	END IF;
	v_exists := v_p.id IS NOT NULL;
	-- Another uid's retirement of the id (a release that retired it
	-- unclaimed) goes, and the claim goes on as new ("released" said by
	-- released_at, the same test by the CHECK on permits: permits_pkey
	-- answers it by id); a refusal below rolls the delete back.
	IF v_exists AND p_uid IS NOT NULL AND v_p.released_at IS NOT NULL
	   AND v_p.quota_key IS NULL THEN
		DELETE FROM pgcoord.permits p
		WHERE p.id = p_id AND p.released_at IS NOT NULL AND p.quota_key IS NULL
		  AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_quotas_multi pq
				  WHERE pq.permit_id = p.id)
		  AND (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = p.owner_session)
			IS DISTINCT FROM p_uid;
		IF FOUND THEN
			DELETE FROM pgcoord.permit_events_log e WHERE e.permit_id = p_id;
			v_exists := false;
		END IF;
	END IF;

	IF NOT v_exists THEN
		-- the per-call limit applies to this very admission, and stays
		-- recorded if the claim is denied: it is the caller's current
		-- word on the quota, not part of the grant. A retry of an
		-- existing id changes nothing, limit included.
		IF v_limit IS NOT NULL THEN
			PERFORM pgcoord.quota_apply(p_keys[1], v_limit, NULL, p_actor,
				'claim ' || p_id);
		END IF;
		-- Guarantee 1: one conditional UPDATE per quota, in key order
		-- (the keys are sorted); Postgres re-checks the predicate on the
		-- latest row version under the row lock, so admissions on one
		-- quota serialize and never overshoot, on any agent.
		FOR j IN 1 .. v_n LOOP
			UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[j]
			WHERE q.key = p_keys[j] AND q.in_flight + p_weights[j] <= q."limit"
			  AND q.waiting = 0;
			IF NOT FOUND THEN
				v_denied := j;
				EXIT;
			END IF;
			v_taken := j;
		END LOOP;
		IF v_denied IS NULL THEN
			-- Admitted: the row, its token and (one quota) its admission
			-- event in one insert, drawn under the quota rows' locks. The
			-- guard (guarantee 3) is its NOT EXISTS, read with this new
			-- statement's snapshot: a duplicate of the id that held a
			-- quota row before us has committed by now, and is seen.
			INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica,
				state, phase, on_owner_loss, intent, quota_key, quota_weight,
				admit_event, admit_actor)
			SELECT p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
				'reserved', p_on_owner_loss, p_intent,
				CASE WHEN v_n = 1 THEN p_keys[1] END,
				CASE WHEN v_n = 1 THEN p_weights[1] END,
				CASE WHEN v_n = 1 AND p_actor IS NOT NULL
				     THEN nextval('pgcoord.permit_events_id_seq') END,
				CASE WHEN v_n = 1 THEN p_actor END
			WHERE NOT EXISTS (SELECT 1 FROM pgcoord.permits x WHERE x.id = p_id)
			RETURNING * INTO v_p;
			v_exists := NOT FOUND;
		ELSE
			-- denied; unless a duplicate committed while we waited
			PERFORM 1 FROM pgcoord.permits p WHERE p.id = p_id;
			v_exists := FOUND;
		END IF;
		IF v_exists OR v_denied IS NOT NULL THEN
			-- what this call took goes back: the row was never ours, or
			-- nothing of a refused claim remains (all or nothing)
			FOR j IN 1 .. v_taken LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight - p_weights[j]
				WHERE q.key = p_keys[j];
			END LOOP;
		END IF;
		IF NOT v_exists AND v_denied IS NOT NULL THEN
			SELECT q."limit", q.in_flight INTO v_denied_limit, v_denied_in_flight
			FROM pgcoord.quotas q WHERE q.key = p_keys[v_denied];
		ELSIF NOT v_exists AND (v_n > 1 OR p_actor IS NULL) THEN
			-- the shares (of two or more quotas) and their audit rows;
			-- and every event names its actor: the log refuses a row
			-- without one (not_null_violation), as it refused the audit
			-- row before
			INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
			SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w)
			WHERE v_n > 1;
			INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, t.k, t.w, 'admitted', p_actor, 'held', 'reserved'
			FROM unnest(p_keys, p_weights) AS t(k, w) ORDER BY t.k COLLATE "C";
		END IF;
	END IF;

	-- ms(), written out
	v_d.now_at := (extract(epoch FROM now()) * 1000)::bigint;
	IF NOT v_exists AND v_denied IS NOT NULL THEN
		v_d.status := CASE WHEN v_denied_limit IS NULL THEN 'unknown_quota'
			      ELSE 'denied' END::pgcoord.claim_status;
		v_d.denied_key := p_keys[v_denied];
		v_d.denied_limit := v_denied_limit;
		v_d.denied_in_flight := v_denied_in_flight;
		RETURN v_d;
	END IF;
	IF NOT v_exists THEN
		v_d.status := 'admitted';
		v_d.token := v_p.token;
		v_d.state := v_p.state;
		v_d.phase := v_p.phase;
		v_d.owner_session := v_p.owner_session;
		v_d.owner_replica := v_p.owner_replica;
		v_d.created_at := (extract(epoch FROM v_p.created_at) * 1000)::bigint;
		RETURN v_d;
	END IF;

	-- The id exists (committed): a refusal from here on writes nothing
	-- before it.
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id;
	-- the owner's uid comes with the quotas, in the same statement: a
	-- retry costs no statement more than it did
	SELECT string_agg(pq.key || ':' || pq.weight, ',' ORDER BY pq.key),
	       (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = v_p.owner_session)
	INTO v_quotas, v_owner_uid
	FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p_id;
	-- another uid's id (held, uncertain or released; its retirement went
	-- above), also for an admin: refused before any answer that would
	-- tell its state, quotas or grant (see 0010)
	IF p_uid IS NOT NULL AND v_owner_uid IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION USING ERRCODE = 'PCCFL', MESSAGE = pgcoord.claim_id_taken(p_id);
	END IF;
	IF v_p.state = 'released' AND v_quotas IS NULL THEN
		-- a tombstone without quotas: a release retired the id unclaimed
		RAISE EXCEPTION 'permit id "%" was retired at % (ms, database clock) by a release '
			'before any claim of it committed; an id is granted at most once: claim with '
			'a new id', p_id, pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_p.state = 'released' THEN
		RAISE EXCEPTION 'permit "%" was already granted and released at % (ms, database '
			'clock); an id is granted at most once: claim with a new id', p_id,
			pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_quotas IS DISTINCT FROM (SELECT string_agg(t.k || ':' || t.w, ',' ORDER BY t.k COLLATE "C")
				      FROM unnest(p_keys, p_weights) AS t(k, w)) THEN
		RAISE EXCEPTION 'permit "%" already exists with other quotas (%); one id names one '
			'claim', p_id, v_quotas USING ERRCODE = 'PCCFL';
	END IF;
	SELECT 'held', v_p.token, s.effective_state, v_p.phase, v_p.owner_session,
		v_p.owner_replica, pgcoord.ms(v_p.created_at)
	INTO v_d.status, v_d.token, v_d.state, v_d.phase, v_d.owner_session, v_d.owner_replica,
		v_d.created_at
	FROM pgcoord.permit_status s WHERE s.id = p_id;
	RETURN v_d;
END $$;

-- A group of claims: judged in memory as before (0004), the rows of the
-- admitted members inserted once, after the quota rows' locks (above).
CREATE OR REPLACE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[],
	p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[], p_replicas text[],
	p_on_owner_loss text[], p_intents bytea[], p_limits integer[], p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text,
	status pgcoord.claim_status, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, now_at bigint, "position" bigint,
	queued_at bigint, deadline_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
	SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
	v_n integer := coalesce(cardinality(p_ids), 0);
	v_set integer[];     -- members judged in memory, arrival order
	v_alone integer[] := '{}'; -- members judged by permit_claim_as, after
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
	v_qd integer[];      -- the net weight admitted on each of v_qk
	v_adm integer[] := '{}';
	v_am integer[] := '{}'; -- the admitted members' shares, flat, in
	v_ak text[] := '{}';    -- admission order then key order: member,
	v_aw integer[] := '{}'; -- key, weight
	v_multi integer[] := '{}'; -- admitted members of two or more quotas
	v_den integer[] := '{}';
	v_den_key text[] := '{}';
	v_den_limit integer[] := '{}';
	v_den_in_flight bigint[] := '{}';
	v_k text[];
	v_w integer[];
	v_dk text;
	v_pos integer;
	v_now bigint;
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
	-- The common members, in arrival order (see above). A member's keys or
	-- weights that do not parse as an array fail this statement: then the
	-- whole group goes member by member, each refused alone.
	BEGIN
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
			  -- one key in a plain one-dimensional array is sorted and
			  -- distinct: no sort per member
			  AND (cardinality(m.k::text[]) = 1 AND array_ndims(m.k::text[]) = 1
			       AND array_lower(m.k::text[], 1) = 1
			       OR m.k::text[] = ARRAY(SELECT DISTINCT x COLLATE "C"
						      FROM unnest(m.k::text[]) AS x ORDER BY 1))
			  AND 1 <= ALL (m.w::integer[])
			  -- weights by the keys' subscripts, as the judging below reads them
			  AND array_ndims(m.w::integer[]) = 1 AND array_lower(m.w::integer[], 1) = 1
			  AND (SELECT count(*) FROM unnest(p_ids) AS d WHERE d = m.id) = 1
			  AND NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = m.id)
			ORDER BY m.i);
	EXCEPTION WHEN OTHERS THEN
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
			ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids, p_keys,
			p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
			p_actors);
		RETURN;
	END;

	IF cardinality(v_set) < v_n THEN
		v_alone := ARRAY(SELECT g FROM generate_series(1, v_n) AS g
				 WHERE g <> ALL (v_set) ORDER BY 1);
	END IF;

	-- The session rows, each locked in id order as session_lock_live locks
	-- one (written out: a call per session costs a SECURITY DEFINER frame;
	-- the lateral lookup keeps the generic plan a probe by id per session,
	-- where "id = ANY" let it walk every open session), then the members
	-- split by whether their session is live.
	v_live := ARRAY(
		SELECT l.id FROM (SELECT DISTINCT p_sessions[i] AS id FROM unnest(v_set) AS i
				  WHERE p_sessions[i] IS NOT NULL ORDER BY 1) d
		CROSS JOIN LATERAL (
			SELECT s.id FROM pgcoord.sessions s
			WHERE s.id = d.id AND s.closed_at IS NULL
			  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
			FOR KEY SHARE) l);
	v_more := v_set;
	v_set := '{}';
	v_dead := '{}';
	FOREACH i IN ARRAY v_more LOOP
		IF p_sessions[i] = ANY (v_live) THEN
			v_set := v_set || i;
		ELSE
			v_dead := v_dead || i;
		END IF;
	END LOOP;

	-- the closure: nobody judged in memory shares a quota with a member
	-- judged alone. Only members the statement above could not judge are
	-- alone; their keys may not even parse, which sends the whole group
	-- member by member, as above.
	IF cardinality(v_alone) > 0 THEN
		BEGIN
			v_alone_keys := ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
					      FROM unnest(v_alone) AS i);
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
				ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids,
				p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss,
				p_intents, p_limits, p_actors);
			RETURN;
		END;
		LOOP
			v_more := ARRAY(SELECT i FROM unnest(v_set) AS i
					WHERE p_keys[i]::text[] && v_alone_keys);
			EXIT WHEN cardinality(v_more) = 0;
			v_alone := ARRAY(SELECT unnest(v_alone || v_more) ORDER BY 1);
			v_set := ARRAY(SELECT i FROM unnest(v_set) WITH ORDINALITY AS s(i, o)
				       WHERE i <> ALL (v_more) ORDER BY o);
			v_alone_keys := v_alone_keys
				|| ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
					 FROM unnest(v_more) AS i);
		END LOOP;
	END IF;

	SELECT array_agg(q.key ORDER BY q.key), array_agg(q."limit" ORDER BY q.key),
	       array_agg(q.in_flight ORDER BY q.key), array_agg(q.waiting ORDER BY q.key)
	INTO v_qk, v_ql, v_qf, v_qw
	FROM (SELECT q.key, q."limit", q.in_flight, q.waiting FROM pgcoord.quotas q
	      WHERE q.key = ANY (ARRAY(SELECT DISTINCT unnest(p_keys[i]::text[])
				       FROM unnest(v_set) AS i))
	      ORDER BY q.key FOR NO KEY UPDATE OF q) q;
	v_qd := array_fill(0, ARRAY[coalesce(cardinality(v_qk), 0)]);

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
				v_qd[v_pos] := v_qd[v_pos] + v_w[j];
				v_am := v_am || i;
				v_ak := v_ak || v_k[j];
				v_aw := v_aw || v_w[j];
			END LOOP;
			v_adm := v_adm || i;
			IF cardinality(v_k) > 1 THEN
				v_multi := v_multi || i;
			END IF;
		ELSE
			v_den := v_den || i;
			v_den_key := v_den_key || v_dk;
			v_den_limit := v_den_limit || v_ql[v_pos];
			v_den_in_flight := v_den_in_flight || v_qf[v_pos];
		END IF;
	END LOOP;

	-- The admitted members' rows, once, after the quota rows' locks: the
	-- tokens in arrival order, and a permit of one quota its 'admitted'
	-- event in its row (its id, in admission order, and its actor; 0016).
	-- The guard (guarantee 3) is the NOT EXISTS, read with this new
	-- statement's snapshot, after the locks: an id that a duplicate
	-- committed meanwhile is not inserted, and then the whole group goes
	-- member by member, as before, with nothing of this part left.
	WITH ins AS (
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, intent, quota_key, quota_weight, admit_event,
			admit_actor)
		SELECT p_ids[a.m], nextval('pgcoord.token_seq'), p_sessions[a.m], p_replicas[a.m],
		       'held', 'reserved', p_on_owner_loss[a.m], p_intents[a.m],
		       CASE WHEN a.one THEN (SELECT x.k FROM unnest(p_keys[a.m]::text[]) AS x(k)) END,
		       CASE WHEN a.one THEN (SELECT x.w FROM unnest(p_weights[a.m]::integer[]) AS x(w))
		       END,
		       CASE WHEN a.one THEN nextval('pgcoord.permit_events_id_seq') END,
		       CASE WHEN a.one THEN p_actors[a.m] END
		FROM (SELECT a.m, a.m <> ALL (v_multi) AS one
		      FROM unnest(v_adm) WITH ORDINALITY AS a(m, o)
		      WHERE NOT EXISTS (SELECT 1 FROM pgcoord.permits x WHERE x.id = p_ids[a.m])
		      ORDER BY a.o) a
		RETURNING p.id, p.token)
	SELECT coalesce(array_agg(ins.id), '{}'), coalesce(array_agg(ins.token), '{}')
	INTO v_ins_ids, v_ins_tokens FROM ins;
	IF cardinality(v_ins_ids) <> cardinality(v_adm) THEN
		-- an id claimed meanwhile elsewhere: the whole group alone
		DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ins_ids);
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
			ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids, p_keys,
			p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
			p_actors);
		RETURN;
	END IF;
	-- a member denied while a duplicate of its id committed meanwhile
	-- (read after the locks, as above) answers the original grant, alone
	-- at the end like the members judged alone (it writes nothing there)
	IF cardinality(v_den) > 0 THEN
		v_more := ARRAY(SELECT d.i FROM unnest(v_den) AS d(i)
				WHERE EXISTS (SELECT 1 FROM pgcoord.permits x WHERE x.id = p_ids[d.i]));
		IF cardinality(v_more) > 0 THEN
			SELECT coalesce(array_agg(d.i ORDER BY d.o), '{}'),
			       coalesce(array_agg(d.k ORDER BY d.o), '{}'),
			       coalesce(array_agg(d.lim ORDER BY d.o), '{}'),
			       coalesce(array_agg(d.f ORDER BY d.o), '{}')
			INTO v_den, v_den_key, v_den_limit, v_den_in_flight
			FROM unnest(v_den, v_den_key, v_den_limit, v_den_in_flight)
				WITH ORDINALITY AS d(i, k, lim, f, o)
			WHERE d.i <> ALL (v_more);
			v_alone := ARRAY(SELECT unnest(v_alone || v_more) ORDER BY 1);
		END IF;
	END IF;
	-- the counters by the net weights judged above, from the shares
	-- gathered while judging (no member's keys parsed again); the shares of
	-- permits of two or more quotas and their audit rows only when there
	-- are some
	UPDATE pgcoord.quotas q
	SET in_flight = q.in_flight + v_qd[array_position(v_qk, q.key::text)]
	WHERE q.key = ANY (v_qk) AND v_qd[array_position(v_qk, q.key::text)] <> 0;
	IF cardinality(v_multi) > 0 THEN
		INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
		SELECT p_ids[a.m], a.k, a.w FROM unnest(v_am, v_ak, v_aw) AS a(m, k, w)
		WHERE a.m = ANY (v_multi);
		INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor, state,
			phase)
		SELECT p_ids[a.m], a.k, a.w, 'admitted', p_actors[a.m], 'held', 'reserved'
		FROM unnest(v_am, v_ak, v_aw) WITH ORDINALITY AS a(m, k, w, o)
		WHERE a.m = ANY (v_multi)
		ORDER BY a.o;
	END IF;

	-- ms(now()), written out: once, not a call per member
	v_now := (extract(epoch FROM now()) * 1000)::bigint;
	RETURN QUERY
	SELECT a.i, a.err_state, a.err_message, (a.d).*
	FROM (
	SELECT i, NULL::text AS err_state, NULL::text AS err_message, ('admitted',
	       v_ins_tokens[array_position(v_ins_ids, p_ids[i])], 'held', 'reserved',
	       p_sessions[i], p_replicas[i], v_now, NULL, NULL, NULL, NULL, v_now, NULL, NULL,
	       NULL)::pgcoord.claim_decision
	FROM unnest(v_adm) AS i
	UNION ALL
	SELECT d.i, NULL, NULL, (CASE WHEN d.lim IS NULL THEN 'unknown_quota'
	       ELSE 'denied' END::pgcoord.claim_status,
	       NULL, NULL, NULL, NULL, NULL, NULL, NULL, d.k, d.lim, d.f, v_now, NULL, NULL,
	       NULL)::pgcoord.claim_decision
	FROM unnest(v_den, v_den_key, v_den_limit, v_den_in_flight) AS d(i, k, lim, f)
	UNION ALL
	-- the lone claim's refusal, as a member's error (groups.c answers it)
	SELECT i, 'PCSEX', pgcoord.claim_session_expired(), NULL::pgcoord.claim_decision
	FROM unnest(v_dead) AS i) a(i, err_state, err_message, d);

	IF cardinality(v_alone) > 0 THEN
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(v_alone, p_uids, p_admins,
			p_ids, p_keys, p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents,
			p_limits, p_actors);
	END IF;
END $$;

-- permit.release of one permit. A one-quota permit's counter goes first,
-- by an UPDATE that takes the quota row's lock itself (the lock order:
-- quotas before permits), joined with the permit row as the statement's
-- snapshot shows it, under the guard of the permit's own UPDATE; the
-- permit row second. Before, the quota row was locked by a read first
-- (FOR NO KEY UPDATE: a lock record) and updated after the permit row.
-- Two releases of one permit at once serialize on the quota row; the
-- second then finds the permit released by the first and gives its
-- decrement back before it commits (nobody saw it: the row is locked, and
-- the queue's hand-over runs at commit, on the net counter).
CREATE OR REPLACE FUNCTION pgcoord.permit_release_one(p_uid bigint, p_id text, p_session bigint,
	p_override boolean, p_actor text, p_reason text)
RETURNS pgcoord.release_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_key text;
	v_weight integer;
	v_phase text;
	v_replica text;
	v_now bigint;
	v_prev text;
BEGIN
	UPDATE pgcoord.quotas q SET in_flight = q.in_flight - p.quota_weight
	FROM pgcoord.permits p
	WHERE p.id = p_id AND q.key = p.quota_key AND p.released_at IS NULL
	  AND (p_override OR p.state = 'held')
	  AND (p_override OR (p.owner_session = p_session
	       AND (SELECT s.owner_uid FROM pgcoord.sessions s
		    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM p_uid))
	RETURNING q.key, p.quota_weight INTO v_key, v_weight;

	IF v_key IS NOT NULL THEN
		-- the guard of permit_release_group's UPDATE, for one member;
		-- an ordinary release's 'released' event in the row (0016), any
		-- other's in the log, in the same statement
		WITH r AS (
			UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
				state_at = now(),
				release_event = CASE WHEN p.admit_event IS NOT NULL
							  AND p_override IS FALSE AND p_reason IS NULL
					THEN nextval('pgcoord.permit_events_id_seq') END,
				release_actor = CASE WHEN p.admit_event IS NOT NULL
							  AND p_override IS FALSE AND p_reason IS NULL
					THEN nullif(coalesce(p_actor,
							     'agent@' || coalesce(p.owner_replica, '?')),
						    p.admit_actor) END
			WHERE p.id = p_id AND p.released_at IS NULL AND p.quota_key = v_key
			  AND (p_override OR p.state = 'held')
			  AND (p_override OR (p.owner_session = p_session
			       AND (SELECT s.owner_uid FROM pgcoord.sessions s
				    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM p_uid))
			RETURNING p.phase, p.owner_replica, p.quota_key, p.quota_weight,
				p.release_event),
		e AS (
			INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor,
				reason, state, phase)
			SELECT p_id, r.quota_key, -r.quota_weight,
			       CASE WHEN p_override THEN 'override_released' ELSE 'released' END,
			       coalesce(p_actor, 'agent@' || coalesce(r.owner_replica, '?')),
			       p_reason, 'released', r.phase
			FROM r WHERE r.release_event IS NULL)
		SELECT r.phase INTO v_phase FROM r;
		IF FOUND THEN
			v_now := (extract(epoch FROM now()) * 1000)::bigint;
			RETURN ('released', 'released', v_now, v_now)::pgcoord.release_decision;
		END IF;
		-- released meanwhile (or changed): the decrement goes back, and
		-- the answer is a lone release's. Raising a counter a queue may
		-- wait on is the hand-over's right alone (quotas_no_overtaking):
		-- this gives back what this transaction took, so it borrows it.
		v_prev := current_setting('pgcoord.handing_over', true);
		PERFORM set_config('pgcoord.handing_over', 'on', true);
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight + v_weight WHERE q.key = v_key;
		PERFORM set_config('pgcoord.handing_over', coalesce(v_prev, ''), true);
		RETURN pgcoord.permit_release_as(p_uid, p_id, p_session, p_override, p_actor,
			p_reason);
	END IF;

	-- two or more quotas: their rows locked in key order, then the permit
	-- row, its counters and audit rows
	PERFORM 1 FROM pgcoord.quotas q
	WHERE q.key = ANY (ARRAY(SELECT pq.key FROM pgcoord.permit_quotas_multi pq
				 WHERE pq.permit_id = p_id))
	ORDER BY q.key
	FOR NO KEY UPDATE OF q;
	IF NOT FOUND THEN
		-- no share anywhere this call could release: a lone release's answer
		RETURN pgcoord.permit_release_as(p_uid, p_id, p_session, p_override, p_actor,
			p_reason);
	END IF;
	UPDATE pgcoord.permits p SET state = 'released', released_at = now(), state_at = now()
	WHERE p.id = p_id AND p.released_at IS NULL AND p.quota_key IS NULL
	  AND (p_override OR p.state = 'held')
	  AND (p_override OR (p.owner_session = p_session
	       AND (SELECT s.owner_uid FROM pgcoord.sessions s
		    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM p_uid))
	RETURNING p.phase, p.owner_replica INTO v_phase, v_replica;
	IF NOT FOUND THEN
		RETURN pgcoord.permit_release_as(p_uid, p_id, p_session, p_override, p_actor,
			p_reason);
	END IF;
	WITH s AS (
		SELECT pq.key, pq.weight FROM pgcoord.permit_quotas_multi pq
		WHERE pq.permit_id = p_id),
	u AS (
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - s.weight
		FROM s WHERE q.key = s.key)
	INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor, reason,
		state, phase)
	SELECT p_id, s.key, -s.weight,
	       CASE WHEN p_override THEN 'override_released' ELSE 'released' END,
	       coalesce(p_actor, 'agent@' || coalesce(v_replica, '?')), p_reason,
	       'released', v_phase
	FROM s ORDER BY s.key;

	v_now := (extract(epoch FROM now()) * 1000)::bigint;
	RETURN ('released', 'released', v_now, v_now)::pgcoord.release_decision;
END $$;

SELECT pgcoord.secure_functions();
