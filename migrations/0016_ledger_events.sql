-- The events of an ordinary cycle are read from the permit row.
--
-- A claim and the release of a permit of one quota wrote two audit rows,
-- 'admitted' and 'released', and their b-tree entries: about a third of
-- the WAL of a cycle (docs/PERFORMANCE.md). Everything in those two rows
-- but their ids and actors is in the permit row already: the permit, its
-- quota and weight, the time of the claim (created_at) and of the release
-- (released_at), the phase it was released in. So the permit row carries
-- the rest:
--
--   admit_event, admit_actor      the 'admitted' event's id and actor
--   release_event, release_actor  the 'released' event's id, and its actor
--                                 when it is not the admission's (NULL: the
--                                 same)
--
-- An event id is drawn from the sequence of every audit row, under the
-- quota row's lock, where the audit row's id was drawn, so the ids order
-- the events of a quota as before. The table of audit rows is now
-- permit_events_log, and keeps what a permit row cannot tell: admissions
-- of two or more quotas, from the queue, and every event of a permit
-- claimed before this migration; the 'released' of a release with a
-- reason or an override; phases, uncertainty, resolutions, owner loss,
-- lapses, retirements, limit_set. pgcoord.permit_events is a view of the
-- log and of the events in the permit rows, one row per event as before,
-- so permits history, the soak checker and every other reader read the
-- whole trail; an insert into the view goes to the log.
--
-- Conservation. The view's deltas sum per quota to in_flight, as the
-- table's did. The check and the fold do not read the view: they read the
-- log (the BRIN index by id, 0005) and the open permits. A permit with its
-- admission in its row (admit_event set) counts there by its weight while
-- it is open and by nothing once released; the deltas of its rows in the
-- log (a release by override, owner loss or lapse) are therefore counted
-- as zero by the fold and the check. Every other permit counts by its rows
-- in the log, exactly as before: a permit claimed before this migration
-- has no admit_event and an explicit admission, and keeps writing its
-- release to the log, so no cycle is counted twice or lost. A permit with
-- its admission in its row, released, has no rows left to fold and leaves
-- with retention like any other.
--
-- The upgrade is a rename, four nullable columns (no rewrite of permits)
-- and functions replaced; held, uncertain and queued permits and their
-- history are as they were. Redefined: permit_claim_as,
-- permit_claim_group, permit_release_group, permit_release_one,
-- janitor_purge_permits, permit_events_summarize, janitor_fold_audit,
-- permits_check. The two claims are 0015's texts with the change above:
-- they judge their session by its liveness rule (pgcoord.live_sessions).

ALTER TABLE pgcoord.permit_events RENAME TO permit_events_log;

-- The release's columns first: its update of the row then has the
-- admission's columns in the suffix it shares with the old row version,
-- which its WAL record leaves out.
ALTER TABLE pgcoord.permits
	ADD COLUMN release_event bigint,
	ADD COLUMN release_actor text,
	ADD COLUMN admit_event bigint,
	ADD COLUMN admit_actor text;

-- Room on each page (new pages only) keeps the claim's update of the row it
-- just inserted (the admission, above) a HOT update: no index entries.
ALTER TABLE pgcoord.permits SET (fillfactor = 90);

-- Every event, one row each: the log's rows and the events in the permit
-- rows. The filters on permit_id push into each branch (permits_pkey,
-- permit_events_by_permit).
CREATE VIEW pgcoord.permit_events AS
	SELECT l.id, l.permit_id, l.key, l.delta, l.event, l.actor, l.reason, l.state, l.phase,
	       l.at
	FROM pgcoord.permit_events_log l
	UNION ALL
	SELECT p.admit_event, p.id::text COLLATE "C", p.quota_key, p.quota_weight::bigint,
	       'admitted'::pgcoord.permit_event_kind, p.admit_actor, NULL::text, 'held'::text,
	       'reserved'::text, p.created_at
	FROM pgcoord.permits p WHERE p.admit_event IS NOT NULL
	UNION ALL
	SELECT p.release_event, p.id::text COLLATE "C", p.quota_key, -p.quota_weight::bigint,
	       'released'::pgcoord.permit_event_kind, coalesce(p.release_actor, p.admit_actor),
	       NULL::text, 'released'::text, p.phase::text, p.released_at
	FROM pgcoord.permits p WHERE p.release_event IS NOT NULL;

-- An audit row written to the view (the functions that write the rarer
-- events, tests, repairs) goes to the log, as it went to the table, with
-- the table's defaults for what it leaves out.
CREATE FUNCTION pgcoord.permit_events_insert()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	NEW.id := coalesce(NEW.id, nextval('pgcoord.permit_events_id_seq'));
	NEW.delta := coalesce(NEW.delta, 0);
	NEW.at := coalesce(NEW.at, now());
	INSERT INTO pgcoord.permit_events_log (id, permit_id, key, delta, event, actor, reason,
		state, phase, at)
	VALUES (NEW.id, NEW.permit_id, NEW.key, NEW.delta, NEW.event, NEW.actor, NEW.reason,
		NEW.state, NEW.phase, NEW.at);
	RETURN NEW;
END $$;

CREATE TRIGGER permit_events_insert INSTEAD OF INSERT ON pgcoord.permit_events
	FOR EACH ROW EXECUTE FUNCTION pgcoord.permit_events_insert();

-- Guarantee 2, as 0005 checks it, with the admissions in the permit rows:
-- the audit sum of a quota is its folded totals, its rows in the log past
-- folded_upto (a permit with its admission in its row counts zero there),
-- and the weights of its open permits with their admission in their row.
-- The last admission is the latest of the log's and of those open
-- permits'; a released one admitted after the limit was last set is looked
-- for only where in_flight is over the limit (the releases since that set,
-- by permits_released_at).
CREATE OR REPLACE FUNCTION pgcoord.permits_check()
RETURNS TABLE (key text, "limit" integer, in_flight bigint, permit_weights bigint,
	audit_sum bigint, problem text)
LANGUAGE sql STABLE SET enable_seqscan = off SET jit = off AS $$
	SELECT q.key::text, q."limit", q.in_flight, coalesce(w.s, 0)::bigint,
	       (coalesce(f.delta_sum, 0) + coalesce(e.s, 0) + coalesce(r.s, 0))::bigint,
	       concat_ws('; ',
		CASE WHEN q.in_flight <> coalesce(w.s, 0)
		     THEN 'in_flight differs from the weights of its open permits' END,
		CASE WHEN q.in_flight <> coalesce(f.delta_sum, 0) + coalesce(e.s, 0) + coalesce(r.s, 0)
		     THEN 'in_flight differs from the sum of its audit deltas' END,
		CASE WHEN q.in_flight > q."limit"
			  AND (greatest(f.last_set, e.last_set) IS NULL
			       OR coalesce(greatest(f.last_admit, e.last_admit, r.last_admit), 0)
				  > greatest(f.last_set, e.last_set)
			       OR EXISTS (
				SELECT 1 FROM pgcoord.permits p
				WHERE p.state = 'released' AND p.quota_key = q.key
				  AND p.admit_event > greatest(f.last_set, e.last_set)
				  AND p.released_at >= (
					SELECT ev.at FROM pgcoord.permit_events_log ev
					WHERE ev.id = greatest(f.last_set, e.last_set))))
		     THEN 'in_flight exceeds the limit and a permit was admitted since it was set'
		END)
	FROM pgcoord.quotas q
	LEFT JOIN (SELECT pq.key, sum(pq.weight) AS s
		   FROM pgcoord.permits p
		   JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id
		   WHERE p.state <> 'released' GROUP BY pq.key) w ON w.key = q.key
	LEFT JOIN (SELECT p.quota_key AS key, sum(p.quota_weight) AS s,
			  max(p.admit_event) AS last_admit
		   FROM pgcoord.permits p
		   WHERE p.state <> 'released' AND p.admit_event IS NOT NULL
		   GROUP BY p.quota_key) r ON r.key = q.key
	LEFT JOIN pgcoord.permit_audit_totals f ON f.key = q.key
	LEFT JOIN (SELECT ev.key,
			  sum(CASE WHEN p.admit_event IS NULL THEN ev.delta ELSE 0 END) AS s,
			  max(ev.id) FILTER (WHERE ev.delta > 0) AS last_admit,
			  max(ev.id) FILTER (WHERE ev.event = 'limit_set') AS last_set
		   FROM pgcoord.permit_events_log ev
		   LEFT JOIN pgcoord.permits p ON p.id = ev.permit_id
		   WHERE ev.id > (SELECT h.folded_upto FROM pgcoord.permit_audit_horizon h
				     WHERE h.one)
		     AND ev.key IS NOT NULL
		   GROUP BY ev.key) e ON e.key = q.key
	ORDER BY q.key
$$;

-- permit.claim, one quota: its admission in the permit row (above).
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
	v_inserted boolean := false;
	v_denied integer; -- the subscript of the first key without room
	v_denied_limit integer;
	v_denied_in_flight bigint;
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
	-- The presence guard (guarantee 3): the permit row goes in first. A
	-- duplicate that races us waits here on our insert and then finds the
	-- row (or, if we were denied, its absence), so a lost-reply retry or a
	-- double delivery can never reach the counters a second time. The
	-- session row is locked first, by the same statement (its FOR KEY
	-- SHARE is taken before the insert runs: a lock, not a write, so a
	-- refusal loses nothing, session_lock_live): no session row, no insert.
	INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
		phase, on_owner_loss, intent, quota_key, quota_weight)
	SELECT p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
		'reserved', p_on_owner_loss, p_intent, CASE WHEN v_n = 1 THEN p_keys[1] END,
		CASE WHEN v_n = 1 THEN p_weights[1] END
	FROM pgcoord.sessions s
	WHERE s.id = p_session AND s.closed_at IS NULL
	  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
	FOR KEY SHARE OF s
	ON CONFLICT (id) DO NOTHING
	RETURNING * INTO v_p;
	v_inserted := FOUND;
	IF NOT v_inserted THEN
		-- no row: the session is not live, or the id exists; the
		-- session is refused first, as before any other answer
		PERFORM 1 FROM pgcoord.sessions s
		WHERE s.id = p_session AND s.closed_at IS NULL
		  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
		FOR KEY SHARE;
		IF NOT FOUND THEN
			RAISE EXCEPTION USING ERRCODE = 'PCSEX',
				MESSAGE = pgcoord.claim_session_expired();
		END IF;
	END IF;
	IF NOT v_inserted AND p_uid IS NOT NULL THEN
		-- the id exists: another uid's retirement of it goes, and the
		-- insert runs again ("released" said by released_at, the same
		-- test by the CHECK on permits: the predicate of
		-- permits_released_at is not implied by it, so no plan can walk
		-- every tombstone of that partial index filtering on the id, as
		-- the one made on a fresh install's empty tables did until an
		-- analyze; permits_pkey answers it by id)
		DELETE FROM pgcoord.permits p
		WHERE p.id = p_id AND p.released_at IS NOT NULL AND p.quota_key IS NULL
		  AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_quotas_multi pq
				  WHERE pq.permit_id = p.id)
		  AND (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = p.owner_session)
			IS DISTINCT FROM p_uid;
		IF FOUND THEN
			-- a refusal below rolls the tombstone's delete back with it
			DELETE FROM pgcoord.permit_events_log e WHERE e.permit_id = p_id;
			INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica,
				state, phase, on_owner_loss, intent, quota_key, quota_weight)
			VALUES (p_id, nextval('pgcoord.token_seq'), p_session, p_replica, 'held',
				'reserved', p_on_owner_loss, p_intent,
				CASE WHEN v_n = 1 THEN p_keys[1] END,
				CASE WHEN v_n = 1 THEN p_weights[1] END)
			ON CONFLICT (id) DO NOTHING
			RETURNING * INTO v_p;
			v_inserted := FOUND;
		END IF;
	END IF;
	IF v_inserted THEN
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
		-- quota serialize and never overshoot, on any agent. One quota:
		-- its UPDATE and its admission are one statement (its share is in
		-- the permit row, and so is its 'admitted' event: the event's id,
		-- drawn under the quota row's lock, and its actor; 0016); a denial
		-- records nothing.
		IF v_n = 1 THEN
			WITH u AS (
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[1]
				WHERE q.key = p_keys[1] AND q.in_flight + p_weights[1] <= q."limit"
				  AND q.waiting = 0
				RETURNING q.key)
			UPDATE pgcoord.permits p
			SET admit_event = nextval('pgcoord.permit_events_id_seq'), admit_actor = p_actor
			FROM u WHERE p.id = p_id;
			IF NOT FOUND THEN
				v_denied := 1;
				SELECT q."limit", q.in_flight INTO v_denied_limit, v_denied_in_flight
				FROM pgcoord.quotas q WHERE q.key = p_keys[1];
			ELSIF p_actor IS NULL THEN
				-- every event names its actor: the log refuses a row
				-- without one (not_null_violation), as it refused the
				-- audit row before
				INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event,
					actor, state, phase)
				VALUES (p_id, p_keys[1], p_weights[1], 'admitted', p_actor, 'held',
					'reserved');
			END IF;
		ELSE
			FOR j IN 1 .. v_n LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[j]
				WHERE q.key = p_keys[j] AND q.in_flight + p_weights[j] <= q."limit"
				  AND q.waiting = 0;
				IF NOT FOUND THEN
					v_denied := j;
					SELECT q."limit", q.in_flight
					INTO v_denied_limit, v_denied_in_flight
					FROM pgcoord.quotas q WHERE q.key = p_keys[j];
					EXIT;
				END IF;
			END LOOP;
		END IF;
		IF v_denied IS NOT NULL THEN
			-- all or nothing: give back the keys before the refusing
			-- one (still locked by us) and take the permit row out
			FOR j IN 1 .. v_denied - 1 LOOP
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight - p_weights[j]
				WHERE q.key = p_keys[j];
			END LOOP;
			DELETE FROM pgcoord.permits p WHERE p.id = p_id AND p.token = v_p.token;
			v_inserted := false;
		ELSIF v_n > 1 THEN
			-- the shares (of two or more quotas) and the audit rows in
			-- one statement
			WITH shares AS (
				INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
				SELECT p_id, t.k, t.w FROM unnest(p_keys, p_weights) AS t(k, w))
			INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, t.k, t.w, 'admitted', p_actor, 'held', 'reserved'
			FROM unnest(p_keys, p_weights) AS t(k, w) ORDER BY t.k COLLATE "C";
		END IF;
	END IF;

	-- ms(), written out
	v_d.now_at := (extract(epoch FROM now()) * 1000)::bigint;
	IF v_denied IS NOT NULL THEN
		v_d.status := CASE WHEN v_denied_limit IS NULL THEN 'unknown_quota'
			      ELSE 'denied' END::pgcoord.claim_status;
		v_d.denied_key := p_keys[v_denied];
		v_d.denied_limit := v_denied_limit;
		v_d.denied_in_flight := v_denied_in_flight;
		RETURN v_d;
	END IF;
	IF v_inserted THEN
		v_d.status := 'admitted';
		v_d.token := v_p.token;
		v_d.state := v_p.state;
		v_d.phase := v_p.phase;
		v_d.owner_session := v_p.owner_session;
		v_d.owner_replica := v_p.owner_replica;
		v_d.created_at := (extract(epoch FROM v_p.created_at) * 1000)::bigint;
		RETURN v_d;
	END IF;

	-- The id exists (committed: ON CONFLICT waited for its inserter, and
	-- inserted nothing): a refusal from here on writes nothing before it.
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id;
	-- the owner's uid comes with the quotas, in the same statement: a
	-- retry costs no statement more than it did
	SELECT string_agg(pq.key || ':' || pq.weight, ',' ORDER BY pq.key),
	       (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = v_p.owner_session)
	INTO v_quotas, v_owner_uid
	FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p_id;
	-- another uid's id (held, uncertain or released; its retirement went
	-- above), also for an admin: refused before any answer that would
	-- tell its state, quotas or grant (see the top of this file)
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

	-- the presence guard, and the tokens in arrival order
	WITH ins AS (
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, intent, quota_key, quota_weight)
		SELECT p_ids[s.i], nextval('pgcoord.token_seq'), p_sessions[s.i], p_replicas[s.i],
		       'held', 'reserved', p_on_owner_loss[s.i], p_intents[s.i],
		       -- a member's arrays may start at any subscript: unnest pairs them
		       CASE WHEN cardinality(p_keys[s.i]::text[]) = 1
			    THEN (SELECT a.k FROM unnest(p_keys[s.i]::text[]) AS a(k)) END,
		       CASE WHEN cardinality(p_keys[s.i]::text[]) = 1
			    THEN (SELECT a.w FROM unnest(p_weights[s.i]::integer[]) AS a(w)) END
		FROM (SELECT s.i FROM unnest(v_set) WITH ORDINALITY AS s(i, o) ORDER BY s.o) s
		ON CONFLICT (id) DO NOTHING
		RETURNING p.id, p.token)
	SELECT coalesce(array_agg(ins.id), '{}'), coalesce(array_agg(ins.token), '{}')
	INTO v_ins_ids, v_ins_tokens FROM ins;
	IF cardinality(v_ins_ids) <> cardinality(v_set) THEN
		-- an id claimed meanwhile elsewhere: the whole group alone
		DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ins_ids);
		RETURN QUERY SELECT * FROM pgcoord.permit_claim_members(
			ARRAY(SELECT generate_series(1, v_n)), p_uids, p_admins, p_ids, p_keys,
			p_weights, p_sessions, p_replicas, p_on_owner_loss, p_intents, p_limits,
			p_actors);
		RETURN;
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

	IF cardinality(v_den) > 0 THEN
		DELETE FROM pgcoord.permits p
		WHERE p.id = ANY (ARRAY(SELECT p_ids[i] FROM unnest(v_den) AS i));
	END IF;
	-- the counters by the net weights judged above and the admissions in
	-- one statement, from the shares gathered while judging (no member's
	-- keys parsed again): a permit of one quota records its 'admitted'
	-- event in its own row (its id, drawn under the quota rows' locks, in
	-- admission order, and its actor; 0016); the shares of permits of two
	-- or more quotas and their audit rows only when there are some
	WITH counters AS (
		UPDATE pgcoord.quotas q
		SET in_flight = q.in_flight + v_qd[array_position(v_qk, q.key::text)]
		WHERE q.key = ANY (v_qk) AND v_qd[array_position(v_qk, q.key::text)] <> 0)
	UPDATE pgcoord.permits p SET admit_event = x.ev, admit_actor = p_actors[x.m]
	FROM (SELECT a.m, nextval('pgcoord.permit_events_id_seq') AS ev
	      FROM unnest(v_adm) WITH ORDINALITY AS a(m, o)
	      WHERE a.m <> ALL (v_multi) ORDER BY a.o) x
	WHERE p.id = p_ids[x.m];
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

CREATE OR REPLACE FUNCTION pgcoord.permit_release_group(p_uids bigint[], p_ids text[],
	p_sessions bigint[], p_overrides boolean[], p_actors text[], p_reasons text[])
RETURNS TABLE (member integer, err_state text, err_message text,
	status pgcoord.release_status, state text, released_at bigint, now_at bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
	SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
	v_n integer := coalesce(cardinality(p_ids), 0);
	v_done integer[];
	v_now bigint;
	i integer;
BEGIN
	IF v_n > 1 AND cardinality(ARRAY(SELECT DISTINCT unnest(p_ids))) <> v_n THEN
		PERFORM pgcoord.permits_lock_quotas(p_ids);
		FOR i IN 1 .. v_n LOOP
			BEGIN
				RETURN QUERY SELECT i, NULL::text, NULL::text, r.*
				FROM pgcoord.permit_release_as(p_uids[i], p_ids[i], p_sessions[i],
					p_overrides[i], p_actors[i], p_reasons[i]) r;
			EXCEPTION WHEN OTHERS THEN
				RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text,
					NULL::pgcoord.release_status, NULL::text, NULL::bigint,
					NULL::bigint;
			END;
		END LOOP;
		RETURN;
	END IF;

	PERFORM 1 FROM pgcoord.quotas q
	WHERE q.key = ANY (ARRAY(SELECT DISTINCT pq.key FROM pgcoord.permit_quotas pq
				 WHERE pq.permit_id = ANY (p_ids)))
	ORDER BY q.key
	FOR NO KEY UPDATE OF q;

	WITH m AS (
		SELECT * FROM unnest(p_ids, p_uids, p_sessions, p_overrides, p_actors, p_reasons)
			WITH ORDINALITY AS m(id, uid, session, override, actor, reason, i)),
	r AS (
		UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
			state_at = now(),
			-- an ordinary release of a permit whose admission is in its
			-- row: its 'released' event too (0016)
			release_event = CASE WHEN p.admit_event IS NOT NULL AND m.override IS FALSE AND m.reason IS NULL
				THEN nextval('pgcoord.permit_events_id_seq') END,
			release_actor = CASE WHEN p.admit_event IS NOT NULL AND m.override IS FALSE AND m.reason IS NULL
				THEN nullif(coalesce(m.actor, 'agent@' || coalesce(p.owner_replica, '?')),
					    p.admit_actor) END
		FROM m
		-- "not released" said by released_at (the CHECK on permits makes it
		-- the same test): the predicate of permits_open_by_owner is not
		-- implied by it, so the generic plan cannot walk every open permit
		-- when the statistics say there are none; it probes permits_pkey
		WHERE p.id = m.id AND p.released_at IS NULL
		  AND (m.override OR p.state = 'held')
		  -- session_owner_uid written out: a call per member is a SECURITY
		  -- DEFINER call (no inlining, a GUC save and restore each)
		  AND (m.override OR (p.owner_session = m.session
		       AND (SELECT s.owner_uid FROM pgcoord.sessions s
			    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM m.uid))
		RETURNING m.i, p.id, p.phase, p.owner_replica, m.override, m.actor, m.reason,
			p.quota_key, p.quota_weight, p.release_event),
	-- the shares: in the permit row, or (two or more) in permit_quotas_multi
	s AS (
		SELECT r.*, r.quota_key AS key, r.quota_weight AS weight FROM r
		WHERE r.quota_key IS NOT NULL
		UNION ALL
		SELECT r.*, pq.key, pq.weight FROM r JOIN pgcoord.permit_quotas_multi pq
			ON pq.permit_id = r.id
		WHERE r.quota_key IS NULL),
	u AS (
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - t.w
		FROM (SELECT s.key, sum(s.weight) AS w FROM s GROUP BY s.key) t
		WHERE q.key = t.key),
	e AS (
		INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor, reason,
			state, phase)
		SELECT s.id, s.key, -s.weight,
		       CASE WHEN s.override THEN 'override_released' ELSE 'released' END,
		       coalesce(s.actor, 'agent@' || coalesce(s.owner_replica, '?')), s.reason,
		       'released', s.phase
		FROM s WHERE s.release_event IS NULL ORDER BY s.i, s.key)
	SELECT coalesce(array_agg(r.i::integer), '{}') INTO v_done FROM r;

	-- pgcoord.ms(now()) once, written out, not two calls per member
	v_now := (extract(epoch FROM now()) * 1000)::bigint;
	RETURN QUERY SELECT d.i, NULL::text, NULL::text, 'released'::pgcoord.release_status,
		'released'::text, v_now, v_now
	FROM unnest(v_done) AS d(i);
	IF cardinality(v_done) = v_n THEN
		RETURN;
	END IF;

	-- the members left: answered (or retired) as a lone release would
	IF v_n = 1 THEN
		RETURN QUERY SELECT 1, NULL::text, NULL::text, r.*
		FROM pgcoord.permit_release_as(p_uids[1], p_ids[1], p_sessions[1],
			p_overrides[1], p_actors[1], p_reasons[1]) r;
		RETURN;
	END IF;
	FOR i IN 1 .. v_n LOOP
		CONTINUE WHEN i = ANY (v_done);
		BEGIN
			RETURN QUERY SELECT i, NULL::text, NULL::text, r.*
			FROM pgcoord.permit_release_as(p_uids[i], p_ids[i], p_sessions[i],
				p_overrides[i], p_actors[i], p_reasons[i]) r;
		EXCEPTION WHEN OTHERS THEN
			RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text,
				NULL::pgcoord.release_status, NULL::text, NULL::bigint, NULL::bigint;
		END;
	END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgcoord.permit_release_one(p_uid bigint, p_id text, p_session bigint,
	p_override boolean, p_actor text, p_reason text)
RETURNS pgcoord.release_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_key text;
	v_phase text;
	v_replica text;
	v_now bigint;
BEGIN
	-- a one-quota permit's share is in its own row: its quota row is
	-- locked by a join that locks only that row (the permit row is read
	-- unlocked, only to know which quota: the UPDATE below re-reads it)
	SELECT q.key INTO v_key FROM pgcoord.permits p
	JOIN pgcoord.quotas q ON q.key = p.quota_key
	WHERE p.id = p_id
	FOR NO KEY UPDATE OF q;
	IF v_key IS NULL THEN
		PERFORM 1 FROM pgcoord.quotas q
		WHERE q.key = ANY (ARRAY(SELECT pq.key FROM pgcoord.permit_quotas_multi pq
					 WHERE pq.permit_id = p_id))
		ORDER BY q.key
		FOR NO KEY UPDATE OF q;
	END IF;

	-- the guard of permit_release_group's UPDATE, for one member; a
	-- one-quota permit's counter and audit row go in the same statement
	WITH r AS (
		UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
			state_at = now(),
			-- its 'released' event in its row, as in permit_release_group
			release_event = CASE WHEN p.admit_event IS NOT NULL AND p_override IS FALSE AND p_reason IS NULL
				THEN nextval('pgcoord.permit_events_id_seq') END,
			release_actor = CASE WHEN p.admit_event IS NOT NULL AND p_override IS FALSE AND p_reason IS NULL
				THEN nullif(coalesce(p_actor, 'agent@' || coalesce(p.owner_replica, '?')),
					    p.admit_actor) END
		WHERE p.id = p_id AND p.released_at IS NULL
		  AND (p_override OR p.state = 'held')
		  AND (p_override OR (p.owner_session = p_session
		       AND (SELECT s.owner_uid FROM pgcoord.sessions s
			    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM p_uid))
		RETURNING p.phase, p.owner_replica, p.quota_key, p.quota_weight, p.release_event),
	u AS (
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - r.quota_weight
		FROM r WHERE q.key = r.quota_key),
	e AS (
		INSERT INTO pgcoord.permit_events_log (permit_id, key, delta, event, actor, reason,
			state, phase)
		SELECT p_id, r.quota_key, -r.quota_weight,
		       CASE WHEN p_override THEN 'override_released' ELSE 'released' END,
		       coalesce(p_actor, 'agent@' || coalesce(r.owner_replica, '?')), p_reason,
		       'released', r.phase
		FROM r WHERE r.quota_key IS NOT NULL AND r.release_event IS NULL)
	SELECT r.phase, r.owner_replica, r.quota_key INTO v_phase, v_replica, v_key FROM r;
	IF NOT FOUND THEN
		RETURN pgcoord.permit_release_as(p_uid, p_id, p_session, p_override, p_actor,
			p_reason);
	END IF;

	IF v_key IS NULL THEN
		-- two or more quotas: the shares in permit_quotas_multi
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
	END IF;

	v_now := (extract(epoch FROM now()) * 1000)::bigint;
	RETURN ('released', 'released', v_now, v_now)::pgcoord.release_decision;
END $$;

CREATE OR REPLACE FUNCTION pgcoord.janitor_purge_permits(p_limit integer, p_keep_s integer)
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_ids text[];
	v_upto bigint := (SELECT h.folded_upto FROM pgcoord.permit_audit_horizon h);
BEGIN
	SELECT coalesce(array_agg(d.id), '{}') INTO v_ids
	FROM (SELECT p.id FROM pgcoord.permits p
	      WHERE p.state = 'released'
		AND p.released_at < now() - make_interval(secs => p_keep_s)
		AND NOT EXISTS (SELECT 1 FROM pgcoord.records r WHERE r.permit_id = p.id)
		AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_events_log e
				WHERE e.permit_id = p.id AND e.id > v_upto)
	      ORDER BY p.released_at
	      LIMIT p_limit
	      FOR UPDATE OF p SKIP LOCKED) d;
	IF cardinality(v_ids) = 0 THEN
		RETURN 0;
	END IF;
	DELETE FROM pgcoord.permit_events_log e WHERE e.permit_id = ANY (v_ids);
	DELETE FROM pgcoord.permit_quotas_multi pq WHERE pq.permit_id = ANY (v_ids);
	DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ids);
	RETURN cardinality(v_ids);
END $$;

-- Records settled before the horizon, with their audit rows.

CREATE OR REPLACE FUNCTION pgcoord.permit_events_summarize(p_from bigint, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	c_range constant bigint := 8;
	v_blocks bigint := pg_relation_size('pgcoord.permit_events_log')
		/ current_setting('block_size')::bigint;
	v_last bigint := greatest(v_blocks - 1, 0) / c_range * c_range;
	v_from bigint := least(p_from, v_last);
	v_n integer := 0;
BEGIN
	IF v_from >= v_last THEN
		RETURN v_from;
	END IF;
	BEGIN
		LOCK TABLE pgcoord.permit_events_log IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
	EXCEPTION WHEN lock_not_available THEN
		RETURN v_from;
	END;
	WHILE v_from < v_last AND v_n < p_limit LOOP
		PERFORM brin_summarize_range('pgcoord.permit_events_by_id', v_from);
		v_from := v_from + c_range;
		v_n := v_n + 1;
	END LOOP;
	RETURN v_from;
END $$;

-- Folds at most p_limit * 100 audit ids per call, so that a backlog (the
-- whole history of a large table) goes in short transactions, well within
-- the janitor's query timeout. Returns how many audit rows it folded.
CREATE OR REPLACE FUNCTION pgcoord.janitor_fold_audit(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
	v_h pgcoord.permit_audit_horizon;
	v_to bigint;
	v_n bigint := 0;
	v_s bigint;
BEGIN
	-- the candidate must be read by statements with their own snapshots
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RETURN 0;
	END IF;
	SELECT * INTO v_h FROM pgcoord.permit_audit_horizon h WHERE h.one FOR UPDATE;
	-- first, so that the scan below skips the ranges it can
	v_h.summarized_below := pgcoord.permit_events_summarize(v_h.summarized_below, p_limit);
	IF v_h.pending_xmax IS NOT NULL
	   AND pg_snapshot_xmin(pg_current_snapshot()) >= v_h.pending_xmax THEN
		v_to := least(v_h.pending_upto, v_h.folded_upto + p_limit::bigint * 100);
		IF v_to > v_h.folded_upto THEN
			INSERT INTO pgcoord.permit_audit_totals AS t (key, delta_sum, last_admit, last_set)
			SELECT ev.key, sum(CASE WHEN p.admit_event IS NULL THEN ev.delta ELSE 0 END),
			       max(ev.id) FILTER (WHERE ev.delta > 0),
			       max(ev.id) FILTER (WHERE ev.event = 'limit_set')
			FROM pgcoord.permit_events_log ev
			LEFT JOIN pgcoord.permits p ON p.id = ev.permit_id
			WHERE ev.id > v_h.folded_upto AND ev.id <= v_to AND ev.key IS NOT NULL
			GROUP BY ev.key
			ON CONFLICT (key) DO UPDATE SET
				delta_sum = t.delta_sum + excluded.delta_sum,
				last_admit = greatest(t.last_admit, excluded.last_admit),
				last_set = greatest(t.last_set, excluded.last_set);
			GET DIAGNOSTICS v_n = ROW_COUNT;
			v_h.folded_upto := v_to;
		END IF;
	END IF;
	-- a new candidate once the last one is folded (a pending one is kept,
	-- so that a long transaction delays folding only until it ends)
	IF v_h.pending_upto IS NULL OR v_h.folded_upto >= v_h.pending_upto THEN
		v_s := coalesce(pg_sequence_last_value('pgcoord.permit_events_id_seq'), 0);
		-- a new statement, so a snapshot taken after S was read
		v_h.pending_xmax := pg_snapshot_xmax(pg_current_snapshot());
		v_h.pending_upto := v_s;
	END IF;
	UPDATE pgcoord.permit_audit_horizon SET folded_upto = v_h.folded_upto,
		pending_upto = v_h.pending_upto, pending_xmax = v_h.pending_xmax,
		summarized_below = v_h.summarized_below,
		folded_at = CASE WHEN v_n > 0 THEN now() ELSE folded_at END
	WHERE one;
	RETURN v_n;
END $$;


SELECT pgcoord.secure_functions();
