-- A claim of an id that belongs to another uid is refused (PCCFL), where
-- it used to answer that uid's grant: its fencing token, owner session and
-- state, which a claim by any local user could read by guessing ids.
--
-- A permit belongs to the uid of its owner session (sessions.owner_uid,
-- which never changes and stays after the session ended), the same rule
-- every other permit call applies (permit_check_uid). The claimer's uid is
-- compared with it, whatever the permit's state:
-- * held or uncertain: another uid is refused. The same uid keeps the
--   original grant (guarantee 3): a retry of a lost reply, through this
--   agent or another, from the resumed session or from a new session of a
--   restarted process (whose old session may be dead: its row still names
--   the uid);
-- * released: another uid is refused with the same message, not the one
--   naming when it was released, so that it learns only that the id is
--   taken; the same uid is told as before that the id was granted and
--   released. A retirement tombstone is as before: another uid's goes and
--   the claim runs as for a new id, the uid's own is refused as retired;
-- * owned by no session (an operator asserted it running without one): it
--   belongs to no uid, so every claim with a uid is refused;
-- * adopted by a resolve: it belongs to the resolver's uid from then on;
-- * queued (a waiting claim, permit_wait): the waiter's uid is the one that
--   queued it; another uid's wait of the id is refused before the quotas
--   are compared (that refusal would name the waiter's quotas).
-- An admin is refused too: a claim's answer is a grant to work under and
-- fence with, not a view. An admin reads another uid's permit with
-- permit.get and acts on it with release (override) and resolve.
--
-- The refusal names the id only: no token, owner, session, state, quotas
-- or intent. It is raised where the claim has written nothing (the id
-- exists: the insert did nothing), so it loses nothing, and a claim group
-- judges such a member alone (its id exists), so the refusal comes back as
-- that member's error and touches no other member.
--
-- The common claim (a new id) is unchanged. A claim of an existing id reads
-- the owner's uid in the statement that already reads the permit's quotas,
-- so it runs no statement more than before. permit_claim (no caller uid)
-- applies no uid rule, as before.
--
-- permit_claim_as and permit_wait are created again here in full; each
-- differs from its text in 0004 and 0006 only by the owner check.

-- The refusal's message (PCCFL), one text for the lone claim, a member of
-- a claim group and a waiting claim.
CREATE FUNCTION pgcoord.claim_id_taken(p_id text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT format('permit id "%s" is already in use by another owner; choose another id',
		      p_id)
$$;

-- The lone claim, and each member a claim group judges alone (0004).
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
	WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now()
	FOR KEY SHARE OF s
	ON CONFLICT (id) DO NOTHING
	RETURNING * INTO v_p;
	v_inserted := FOUND;
	IF NOT v_inserted THEN
		-- no row: the session is not live, or the id exists; the
		-- session is refused first, as before any other answer
		PERFORM 1 FROM pgcoord.sessions s
		WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now()
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
			DELETE FROM pgcoord.permit_events e WHERE e.permit_id = p_id;
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
		-- its UPDATE and its audit row are one statement (its share is in
		-- the permit row); a denial inserts no audit row.
		IF v_n = 1 THEN
			WITH u AS (
				UPDATE pgcoord.quotas q SET in_flight = q.in_flight + p_weights[1]
				WHERE q.key = p_keys[1] AND q.in_flight + p_weights[1] <= q."limit"
				  AND q.waiting = 0
				RETURNING q.key)
			INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor,
				state, phase)
			SELECT p_id, p_keys[1], p_weights[1], 'admitted', p_actor, 'held',
				'reserved'
			FROM u;
			IF NOT FOUND THEN
				v_denied := 1;
				SELECT q."limit", q.in_flight INTO v_denied_limit, v_denied_in_flight
				FROM pgcoord.quotas q WHERE q.key = p_keys[1];
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
			INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor,
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


-- permit.claim with wait_ms > 0 (0006).
CREATE OR REPLACE FUNCTION pgcoord.permit_wait(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text, p_wait_ms integer)
RETURNS pgcoord.claim_decision
LANGUAGE plpgsql AS $$
DECLARE
	v_w pgcoord.waiters;
	v_c pgcoord.claim_decision;
	v_d pgcoord.claim_decision;
	v_seq bigint;
BEGIN
	-- a retry of a queued id answers where it stands; its wait_ms stands
	SELECT * INTO v_w FROM pgcoord.waiters w WHERE w.id = p_id AND w.state = 'queued';
	-- another uid's waiter (its uid is the one that queued it, the uid of
	-- its session), also for an admin: refused before the quotas are
	-- compared, whose message would name the waiter's
	IF FOUND AND p_uid IS NOT NULL AND v_w.uid IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION USING ERRCODE = 'PCCFL', MESSAGE = pgcoord.claim_id_taken(p_id);
	END IF;
	IF FOUND AND (v_w.keys <> p_keys OR v_w.weights <> p_weights) THEN
		-- a read only so far: the refusal loses nothing
		RAISE EXCEPTION 'permit "%" already exists with other quotas (%); one id names one '
			'claim', p_id, (SELECT string_agg(t.k || ':' || t.w, ',' ORDER BY t.k)
				       FROM unnest(v_w.keys, v_w.weights) AS t(k, w))
			USING ERRCODE = 'PCCFL';
	END IF;
	IF NOT FOUND THEN
		v_c := pgcoord.permit_claim_as(p_uid, p_admin, p_id, p_keys, p_weights,
			p_session, p_replica, p_on_owner_loss, p_intent, p_limit, p_actor);
		IF v_c.status <> 'denied' THEN
			RETURN v_c;
		END IF;
		PERFORM 1 FROM pgcoord.quotas q WHERE q.key = ANY (p_keys) ORDER BY q.key
		FOR NO KEY UPDATE;
		INSERT INTO pgcoord.waiters AS w (id, uid, session, replica, keys, weights, intent,
			on_owner_loss, actor, deadline_at)
		VALUES (p_id, p_uid, p_session, p_replica, p_keys, p_weights, p_intent,
			p_on_owner_loss, p_actor, now() + pgcoord.ms_interval(p_wait_ms))
		ON CONFLICT (id) WHERE state = 'queued' DO NOTHING
		RETURNING w.seq INTO v_seq;
		IF v_seq IS NULL THEN
			-- the same id queued by a concurrent call: answer as a retry
			RETURN pgcoord.permit_wait(p_uid, p_admin, p_id, p_keys, p_weights, p_session,
				p_replica, p_on_owner_loss, p_intent, p_limit, p_actor, p_wait_ms);
		END IF;
		UPDATE pgcoord.quotas q SET waiting = q.waiting + 1 WHERE q.key = ANY (p_keys);
		PERFORM pgcoord.waiters_admit(p_keys);
		SELECT * INTO v_w FROM pgcoord.waiters w WHERE w.seq = v_seq;
	END IF;
	v_d.now_at := pgcoord.ms(now());
	IF v_w.state = 'admitted' THEN
		-- admitted at once: the reply tells it, no notification follows
		DELETE FROM pgcoord.waiters w WHERE w.seq = v_seq;
		SELECT 'admitted', p.token, p.state, p.phase, p.owner_session, p.owner_replica,
			pgcoord.ms(p.created_at)
		INTO v_d.status, v_d.token, v_d.state, v_d.phase, v_d.owner_session,
			v_d.owner_replica, v_d.created_at
		FROM pgcoord.permits p WHERE p.id = p_id;
		RETURN v_d;
	END IF;
	v_d.status := 'queued';
	v_d.owner_session := v_w.session;
	v_d.owner_replica := v_w.replica;
	v_d."position" := pgcoord.waiter_position(v_w.seq);
	v_d.queued_at := pgcoord.ms(v_w.queued_at);
	v_d.deadline_at := pgcoord.ms(v_w.deadline_at);
	RETURN v_d;
END $$;

SELECT pgcoord.secure_functions();
