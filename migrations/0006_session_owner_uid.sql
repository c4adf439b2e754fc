-- Session owners (issue 11): every session carries the uid of the client
-- that opened it (SO_PEERCRED, taken by the agent from the connection; no
-- parameter names it). The uid is the principal: a session is resumed only
-- by its uid (or an admin), and what a session owns — permits, retirements,
-- records — answers to its uid, also after the session died, so a restarted
-- replica running as the same user can take its work back.
--
-- Sessions opened before this migration have no owner (NULL): only admins
-- may resume them or act on what they own.
--
-- The functions of 0001–0005 keep their signatures; the agent calls the new
-- ones below, which check the caller's uid in the same statement (and so
-- the same transaction) as the change they guard.

ALTER TABLE pgcoord.sessions ADD COLUMN owner_uid bigint;

-- Views expand * when they are created: take the new column in.
CREATE OR REPLACE VIEW pgcoord.live_sessions AS
	SELECT s.* FROM pgcoord.sessions s
	WHERE s.closed_at IS NULL AND s.expires_at > now();

-- The uid a session (live or not) was opened by; NULL when unknown.
CREATE FUNCTION pgcoord.session_owner_uid(p_session bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
	SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = p_session
$$;

-- Opens a session owned by p_owner_uid for a current incarnation; no row
-- when the incarnation was superseded.
CREATE FUNCTION pgcoord.session_open(p_replica_id text, p_incarnation bigint, p_name text,
	p_ttl_ms bigint, p_internal boolean, p_owner_uid bigint)
RETURNS TABLE (session_id bigint)
LANGUAGE sql AS $$
	INSERT INTO pgcoord.sessions (replica_id, incarnation, name, expires_at, internal,
		owner_uid)
	SELECT p_replica_id, p_incarnation, p_name, now() + pgcoord.ms_interval(p_ttl_ms),
	       p_internal, p_owner_uid
	WHERE EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING id
$$;

-- Re-attaches a live session of this replica_id for its own uid, or for an
-- admin (p_admin). No row: not resumable here. resumed = false: it exists
-- but belongs to another uid, and nothing changed.
CREATE FUNCTION pgcoord.session_resume(p_id bigint, p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_uid bigint, p_admin boolean)
RETURNS TABLE (session_id bigint, name text, owner_uid bigint, resumed boolean)
LANGUAGE plpgsql AS $$
DECLARE
	v_owner bigint;
	v_name text;
BEGIN
	SELECT s.owner_uid, s.name INTO v_owner, v_name FROM pgcoord.sessions s
	WHERE s.id = p_id AND s.replica_id = p_replica_id AND NOT s.internal
	  AND s.closed_at IS NULL AND s.expires_at > now();
	IF NOT FOUND THEN
		RETURN;
	END IF;
	-- owner_uid never changes, so this check cannot go stale
	IF NOT p_admin AND v_owner IS DISTINCT FROM p_uid THEN
		RETURN QUERY SELECT p_id, v_name, v_owner, false;
		RETURN;
	END IF;
	RETURN QUERY SELECT r.session_id, r.name, v_owner, true
	FROM pgcoord.session_resume(p_id, p_replica_id, p_incarnation, p_ttl_ms) r;
END $$;

-- --- permits ---------------------------------------------------------------

-- permit_claim for the caller p_uid:
-- * a limit from a non-admin only creates a missing quota; an existing
--   quota's limit stays as it is (the limit is then ignored). The check
--   takes no lock (a quota row lock here would come before the permit
--   row, against the claim's lock order), so a quota created by another
--   call in the instant between may still get this limit;
-- * a permit answers to the uid of its owner session; a retirement
--   tombstone's owner is the session that retired the id;
-- * an id another uid retired (a tombstone with no quotas: no claim of it
--   ever committed) does not block the claim: a retirement speaks only for
--   its own uid, so nobody can squat someone else's predictable ids. The
--   tombstone and its audit row go; the claim then runs as for a new id.
--   Deleting the row locks it first, as the claim's own insert would.
CREATE FUNCTION pgcoord.permit_claim_as(p_uid bigint, p_admin boolean, p_id text,
	p_keys text[], p_weights integer[], p_session bigint, p_replica text,
	p_on_owner_loss text, p_intent bytea, p_limit integer, p_actor text)
RETURNS TABLE (status text, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, detail text, now_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_limit integer := p_limit;
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
	RETURN QUERY SELECT * FROM pgcoord.permit_claim(p_id, p_keys, p_weights, p_session,
		p_replica, p_on_owner_loss, p_intent, v_limit, p_actor);
END $$;

-- permit_release for the caller p_uid: without an override, only a permit
-- of the caller's own uid (the owner session check follows in
-- permit_release). An override is the agent's to allow (admins only).
CREATE FUNCTION pgcoord.permit_release_as(p_uid bigint, p_id text, p_session bigint,
	p_override boolean, p_actor text, p_reason text)
RETURNS TABLE (outcome text, detail text, released boolean, state text, released_at bigint,
	now_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_state text;
	v_session bigint;
	v_owner bigint;
BEGIN
	IF NOT p_override THEN
		SELECT p.state, p.owner_session, pgcoord.session_owner_uid(p.owner_session)
		INTO v_state, v_session, v_owner
		FROM pgcoord.permits p WHERE p.id = p_id;
		IF FOUND AND v_owner IS DISTINCT FROM p_uid THEN
			RETURN QUERY SELECT 'forbidden'::text, format('it belongs to uid %s; '
				'releasing another uid''s permit needs admin',
				coalesce(v_owner::text, 'none')), false, v_state, NULL::bigint,
				pgcoord.ms(now());
			RETURN;
		END IF;
	END IF;
	RETURN QUERY SELECT * FROM pgcoord.permit_release(p_id, p_session, p_override, p_actor,
		p_reason);
END $$;

-- permit_resolve for the caller p_uid: a non-admin resolves only permits
-- of its own uid (an uncertain permit of another uid is admin work).
CREATE FUNCTION pgcoord.permit_resolve_as(p_uid bigint, p_admin boolean, p_id text,
	p_session bigint, p_replica text, p_outcome text, p_evidence text, p_override boolean,
	p_actor text)
RETURNS TABLE (outcome text, detail text, changed boolean, state text, owner_session bigint,
	now_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_state text;
	v_session bigint;
	v_owner bigint;
BEGIN
	IF NOT p_admin THEN
		SELECT p.state, p.owner_session, pgcoord.session_owner_uid(p.owner_session)
		INTO v_state, v_session, v_owner
		FROM pgcoord.permits p WHERE p.id = p_id;
		IF FOUND AND v_owner IS DISTINCT FROM p_uid THEN
			RETURN QUERY SELECT 'forbidden'::text, format('it belongs to uid %s; '
				'resolving another uid''s permit needs admin',
				coalesce(v_owner::text, 'none')), false, v_state,
				v_session, pgcoord.ms(now());
			RETURN;
		END IF;
	END IF;
	RETURN QUERY SELECT * FROM pgcoord.permit_resolve(p_id, p_session, p_replica, p_outcome,
		p_evidence, p_override, p_actor);
END $$;

-- --- records ---------------------------------------------------------------

-- record_recover and its dry run, for the caller p_uid (NULL: an admin,
-- every uid): only records whose dead owner had the caller's uid are
-- adopted; other uids' dead owners' records count in left_alone, and
-- remaining counts only what the caller could still take. A call takes no
-- more records than fit a reply of p_max_bytes (the agent's reply budget):
-- the rest count in remaining. Otherwise as in 0004.
CREATE FUNCTION pgcoord.record_recover(p_session bigint, p_kinds text[], p_limit integer,
	p_actor text, p_uid bigint, p_max_bytes bigint)
RETURNS SETOF pgcoord.record_recovery
LANGUAGE plpgsql AS $$
DECLARE
	v_replica text;
	v_c_kinds text[];
	v_c_keys text[];
	v_c_owners bigint[];
	v_owners bigint[];
	v_closed bigint[];
	v_dead bigint[];
	v_a_kinds text[];
	v_a_keys text[];
	v_a_from bigint[];
	v_a_permits text[];
	v_left bigint;
	v_remaining bigint;
BEGIN
	IF NOT pgcoord.session_is_live(p_session) THEN
		RAISE EXCEPTION 'session % is no longer live; open a new one to recover', p_session
		USING ERRCODE = 'PCSEX';
	END IF;
	SELECT s.replica_id INTO v_replica FROM pgcoord.sessions s WHERE s.id = p_session;

	-- 1. Candidates: open records whose owner is not live, locked. SKIP
	-- LOCKED passes over rows a concurrent recovery (or their owner) holds:
	-- that one takes them, or they are left for the next call.
	SELECT coalesce(array_agg(c.kind ORDER BY c.kind, c.key), '{}'),
	       coalesce(array_agg(c.key ORDER BY c.kind, c.key), '{}'),
	       coalesce(array_agg(c.owner_session ORDER BY c.kind, c.key), '{}')
	INTO v_c_kinds, v_c_keys, v_c_owners
	FROM (SELECT r.kind, r.key, r.owner_session FROM pgcoord.records r
	      WHERE NOT r.terminal AND (p_kinds IS NULL OR r.kind = ANY (p_kinds))
		AND NOT pgcoord.session_is_live(r.owner_session)
		AND (p_uid IS NULL
		     OR pgcoord.session_owner_uid(r.owner_session) IS NOT DISTINCT FROM p_uid)
	      ORDER BY r.kind, r.key
	      LIMIT p_limit
	      FOR UPDATE OF r SKIP LOCKED) c;

	-- 1b. The reply stays within p_max_bytes: candidates stop once their
	-- data (and an allowance for the other fields and the permit) would
	-- pass it; the first always goes. The others are left, counted in
	-- remaining, for the next call.
	SELECT coalesce(array_agg(t.kind ORDER BY t.ord), '{}'),
	       coalesce(array_agg(t.key ORDER BY t.ord), '{}'),
	       coalesce(array_agg(t.owner ORDER BY t.ord), '{}')
	INTO v_c_kinds, v_c_keys, v_c_owners
	FROM (SELECT c.kind, c.key, c.owner, c.ord,
		     sum(coalesce(octet_length(r.data), 0) + 1536) OVER (ORDER BY c.ord) AS upto
	      FROM unnest(v_c_kinds, v_c_keys, v_c_owners) WITH ORDINALITY AS c(kind, key, owner, ord)
	      JOIN pgcoord.records r ON r.kind = c.kind AND r.key = c.key) t
	WHERE t.upto <= p_max_bytes OR t.ord = 1;

	IF cardinality(v_c_kinds) > 0 THEN
		-- 2. Make each owner's death final before taking its work. A
		-- heartbeat whose transaction began before ours could still renew
		-- an owner we saw lapsed; closing the row (after locking it, in
		-- id order) stops that, since heartbeats renew only open rows.
		-- An owner such a heartbeat renewed first is live after all and
		-- keeps its records.
		v_owners := ARRAY(SELECT DISTINCT o FROM unnest(v_c_owners) AS o ORDER BY o);
		PERFORM 1 FROM pgcoord.sessions s WHERE s.id = ANY (v_owners)
		ORDER BY s.id FOR UPDATE;
		WITH c AS (
			UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = 'expired'
			WHERE s.id = ANY (v_owners) AND s.closed_at IS NULL AND s.expires_at <= now()
			RETURNING s.id)
		SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO v_closed FROM c;
		IF cardinality(v_closed) > 0 THEN
			-- The consequences of a lapsed session's end, exactly as when
			-- the janitor expires it (same reason: the hook treats a
			-- session whose agent stopped heartbeating the same, whoever
			-- closes it). Its permits first, so their audit names this
			-- recovery as the actor; the hook's own pass finds them done.
			PERFORM pgcoord.permits_owner_lost(v_closed,
				'owner session expired (found by record recovery)', p_actor);
			PERFORM pgcoord.on_sessions_ended(v_closed, 'owner session expired');
		END IF;
		SELECT coalesce(array_agg(s.id), '{}') INTO v_dead FROM pgcoord.sessions s
		WHERE s.id = ANY (v_owners) AND s.closed_at IS NOT NULL;

		-- 3. Adopt: one atomic conditional UPDATE. The predicate (still
		-- owned by the dead owner we saw, still open) is what Postgres
		-- re-checks on the latest row version, so a record is taken once.
		WITH a AS (
			UPDATE pgcoord.records r
			SET owner_session = p_session, owner_replica = v_replica,
			    token = nextval('pgcoord.token_seq'), adopted_from = r.owner_session,
			    adopted_at = now(), updated_at = now()
			FROM unnest(v_c_kinds, v_c_keys, v_c_owners) AS c(kind, key, owner)
			WHERE r.kind = c.kind AND r.key = c.key AND r.owner_session = c.owner
			  AND r.owner_session = ANY (v_dead) AND NOT r.terminal
			RETURNING r.kind, r.key, r.token, r.adopted_from, r.permit_id, r.state),
		e AS (
			INSERT INTO pgcoord.record_events (kind, key, event, actor, from_session,
				to_session, token, state)
			SELECT a.kind, a.key, 'adopt', p_actor, a.adopted_from, p_session, a.token,
			       a.state
			FROM a ORDER BY a.kind, a.key)
		SELECT coalesce(array_agg(a.kind ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.key ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.adopted_from ORDER BY a.kind, a.key), '{}'),
		       coalesce(array_agg(a.permit_id ORDER BY a.kind, a.key), '{}')
		INTO v_a_kinds, v_a_keys, v_a_from, v_a_permits
		FROM a;

		-- 4. Their permits come along and stay uncertain until the adopter
		-- resolves them with evidence. A dead owner's held permits become
		-- uncertain first (released, for on_owner_loss = release), audited,
		-- exactly as the janitor would do it.
		IF EXISTS (SELECT 1 FROM unnest(v_a_permits) AS x WHERE x IS NOT NULL) THEN
			PERFORM pgcoord.permits_owner_lost(
				ARRAY(SELECT DISTINCT f FROM unnest(v_a_from) AS f),
				'owner session ended (found by record recovery)', p_actor);
			PERFORM 1 FROM pgcoord.permits p WHERE p.id = ANY (v_a_permits)
			ORDER BY p.id FOR UPDATE;
			WITH m AS (
				UPDATE pgcoord.permits p
				SET owner_session = p_session, owner_replica = v_replica
				FROM (SELECT DISTINCT x.id, x.from_session
				      FROM unnest(v_a_permits, v_a_from) AS x(id, from_session)
				      WHERE x.id IS NOT NULL) x
				WHERE p.id = x.id AND p.owner_session = x.from_session
				  AND p.state = 'uncertain'
				RETURNING p.id, p.phase, x.from_session)
			INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state,
				phase)
			SELECT m.id, 'adopted', p_actor,
			       format('record recovery: its record was adopted from dead session %s; '
				      'uncertain until resolved with evidence', m.from_session),
			       'uncertain', m.phase
			FROM m ORDER BY m.id;
		END IF;
	ELSE
		v_a_kinds := '{}';
		v_a_keys := '{}';
	END IF;

	-- 5. What was left: live owners' records and other uids' dead ones
	-- (not the caller's to take), and the dead owners' records of its uid
	-- this call did not take (past the limit, or a concurrent recovery's).
	SELECT count(*) FILTER (WHERE (o.live AND o.owner_session <> p_session)
				   OR (NOT o.live AND NOT o.mine)),
	       count(*) FILTER (WHERE NOT o.live AND o.mine)
	INTO v_left, v_remaining
	FROM (SELECT r.owner_session, pgcoord.session_is_live(r.owner_session) AS live,
		     p_uid IS NULL OR pgcoord.session_owner_uid(r.owner_session)
			IS NOT DISTINCT FROM p_uid AS mine
	      FROM pgcoord.records r
	      WHERE NOT r.terminal AND (p_kinds IS NULL OR r.kind = ANY (p_kinds))) o;

	RETURN QUERY
	SELECT pgcoord.ms(now()), v_left, v_remaining, s.*, p.state, p.phase, p.token,
	       p.owner_session, p.uncertain_reason
	FROM (SELECT 1) one
	LEFT JOIN (pgcoord.record_status s LEFT JOIN pgcoord.permits p ON p.id = s.permit_id)
	  ON (s.kind, s.key) IN (SELECT * FROM unnest(v_a_kinds, v_a_keys))
	ORDER BY s.kind, s.key;
END $$;

CREATE FUNCTION pgcoord.record_recover_preview(p_session bigint, p_kinds text[],
	p_limit integer, p_uid bigint, p_max_bytes bigint)
RETURNS SETOF pgcoord.record_recovery
LANGUAGE sql STABLE AS $$
	WITH open AS (
		SELECT r.kind, r.key, r.owner_session,
		       pgcoord.session_is_live(r.owner_session) AS live,
		       p_uid IS NULL OR pgcoord.session_owner_uid(r.owner_session)
			  IS NOT DISTINCT FROM p_uid AS mine,
		       coalesce(octet_length(r.data), 0) + 1536 AS reply_bytes
		FROM pgcoord.records r
		WHERE NOT r.terminal AND (p_kinds IS NULL OR r.kind = ANY (p_kinds))),
	cand AS (
		SELECT c.kind, c.key
		FROM (SELECT o.kind, o.key, row_number() OVER w AS ord,
			     sum(o.reply_bytes) OVER w AS upto
		      FROM open o WHERE NOT o.live AND o.mine
		      WINDOW w AS (ORDER BY o.kind, o.key)
		      ORDER BY o.kind, o.key LIMIT p_limit) c
		WHERE c.upto <= p_max_bytes OR c.ord = 1),
	totals AS (
		SELECT count(*) FILTER (WHERE (o.live AND o.owner_session
					IS DISTINCT FROM p_session)
				       OR (NOT o.live AND NOT o.mine)) AS left_alone,
		       count(*) FILTER (WHERE NOT o.live AND o.mine) - (SELECT count(*) FROM cand)
			AS remaining
		FROM open o)
	SELECT pgcoord.ms(now()), t.left_alone, t.remaining, s.*, p.state, p.phase, p.token,
	       p.owner_session, p.uncertain_reason
	FROM totals t
	LEFT JOIN (pgcoord.record_status s LEFT JOIN pgcoord.permits p ON p.id = s.permit_id)
	  ON (s.kind, s.key) IN (SELECT c.kind, c.key FROM cand c)
	ORDER BY s.kind, s.key
$$;
