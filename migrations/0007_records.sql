-- Records and recovery (guarantee 8).
--
-- A record is a unit of work a replica drives, named by (kind, key) and
-- owned by the session that put it. The owner is stamped here from the
-- caller's session, which the agent takes from the connection the request
-- came on: no parameter a client sends can name or forge an owner.
-- Recovery hands the open records of owners that are no longer live (and
-- the uncertain permits their work holds) to a live session, one atomic
-- conditional update per row, so two replicas recovering at once never take
-- the same record and nobody takes a live owner's record.
--
-- Every RPC is one call of one function below, so each is one transaction.
-- Refusals are raised with SQLSTATEs of class PC, which the agent answers
-- as wire errors carrying the message (agent/db.c, db_error_for_sqlstate):
--   PCNFD not_found, PCFEN fenced, PCCFL conflict, PCFBD forbidden,
--   PCSEX session_expired.
--
-- Lock order: record rows (by kind, key), then session rows (by id), then
-- the permit functions' own order (quota rows by key, permit rows by id).

CREATE TABLE pgcoord.records (
	kind          text COLLATE "C" NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 200),
	key           text COLLATE "C" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 200),
	state         text NOT NULL CHECK (octet_length(state) BETWEEN 1 AND 64),
	terminal      boolean NOT NULL DEFAULT false,
	data          bytea CHECK (octet_length(data) <= 65536),
	-- the permit the record's work holds; moves with the record on adoption
	permit_id     text COLLATE "C" REFERENCES pgcoord.permits (id),
	owner_session bigint NOT NULL REFERENCES pgcoord.sessions (id),
	owner_replica text NOT NULL,
	-- fencing: a fresh value from token_seq at put and at every adoption
	token         bigint NOT NULL,
	created_at    timestamptz NOT NULL DEFAULT now(),
	updated_at    timestamptz NOT NULL DEFAULT now(),
	settled_at    timestamptz,
	adopted_from  bigint,           -- the dead session of the latest adoption
	adopted_at    timestamptz,
	PRIMARY KEY (kind, key),
	CHECK (terminal = (settled_at IS NOT NULL))
);

CREATE INDEX records_open_by_owner ON pgcoord.records (owner_session) WHERE NOT terminal;

-- The records naming a permit: the retention purge asks whether any record
-- still names each released permit, and deleting a permit makes the foreign
-- key look for records naming it; without this both read every record.
-- Most records name no permit, and neither lookup asks for NULL.
CREATE INDEX records_by_permit ON pgcoord.records (permit_id) WHERE permit_id IS NOT NULL;

-- Every change of a record, in the same transaction as the change.
CREATE TABLE pgcoord.record_events (
	id           bigserial PRIMARY KEY,
	kind         text COLLATE "C" NOT NULL,
	key          text COLLATE "C" NOT NULL,
	event        text NOT NULL CHECK (event IN ('put', 'update', 'settle', 'adopt')),
	actor        text NOT NULL,
	from_session bigint,            -- adopt: the dead owner
	to_session   bigint NOT NULL,   -- the owner after the event
	token        bigint NOT NULL,
	state        text NOT NULL,
	at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX record_events_by_record ON pgcoord.record_events (kind, key, id);

-- A record as the wire shows it: instants in database milliseconds, data
-- in hex (the same text whatever bytea_output says), and whether its owner
-- is live right now.
CREATE VIEW pgcoord.record_status AS
	SELECT r.kind::text AS kind, r.key::text AS key, r.state, r.terminal,
	       encode(r.data, 'hex') AS data_hex,
	       r.permit_id::text AS permit_id, r.owner_session, r.owner_replica,
	       pgcoord.session_is_live(r.owner_session) AS owner_live, r.token,
	       pgcoord.ms(r.created_at) AS created_at, pgcoord.ms(r.updated_at) AS updated_at,
	       pgcoord.ms(r.settled_at) AS settled_at, r.adopted_from,
	       pgcoord.ms(r.adopted_at) AS adopted_at
	FROM pgcoord.records r;

-- Raises why p_session's write (p_verb) of (kind, key) could not happen:
-- the record is missing, was adopted away from this session (fenced: by
-- whom and when), belongs to someone else, is settled, or its owner — the
-- caller — is no longer live.
CREATE FUNCTION pgcoord.record_refuse(p_kind text, p_key text, p_session bigint,
	p_token bigint, p_verb text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	v_r pgcoord.records;
	v_e pgcoord.record_events;
BEGIN
	SELECT * INTO v_r FROM pgcoord.records r WHERE r.kind = p_kind AND r.key = p_key;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no record %/%', p_kind, p_key USING ERRCODE = 'PCNFD';
	END IF;
	IF v_r.owner_session <> p_session THEN
		SELECT * INTO v_e FROM pgcoord.record_events e
		WHERE e.kind = p_kind AND e.key = p_key AND e.event = 'adopt'
		  AND e.from_session = p_session
		ORDER BY e.id DESC LIMIT 1;
		IF FOUND THEN
			RAISE EXCEPTION 'cannot % record %/%: fenced; session % was found dead and '
				'% adopted the record from it at % (token %); its owner now is '
				'session %@%', p_verb, p_kind, p_key, p_session, v_e.actor,
				pgcoord.iso_ms(v_e.at), v_e.token, v_r.owner_session,
				v_r.owner_replica
			USING ERRCODE = 'PCFEN';
		END IF;
		RAISE EXCEPTION 'cannot % record %/%: it is owned by session %@%; only its owner '
			'may', p_verb, p_kind, p_key, v_r.owner_session, v_r.owner_replica
		USING ERRCODE = 'PCFBD';
	END IF;
	IF v_r.terminal THEN
		RAISE EXCEPTION 'cannot % record %/%: it was settled at % in state "%"', p_verb,
			p_kind, p_key, pgcoord.iso_ms(v_r.settled_at), v_r.state
		USING ERRCODE = 'PCCFL';
	END IF;
	IF p_token IS NOT NULL AND p_token <> v_r.token THEN
		RAISE EXCEPTION 'cannot % record %/%: token % is not its current token %', p_verb,
			p_kind, p_key, p_token, v_r.token
		USING ERRCODE = 'PCFEN';
	END IF;
	RAISE EXCEPTION 'cannot % record %/%: session % is no longer live; a live session '
		'will recover the record, so stop its work', p_verb, p_kind, p_key, p_session
	USING ERRCODE = 'PCSEX';
END $$;

-- What record_put answers: whether this call created the record, then the
-- record as record_status shows it.
CREATE TYPE pgcoord.record_put_result AS (created boolean, kind text, key text, state text,
	terminal boolean, data_hex text, permit_id text, owner_session bigint,
	owner_replica text, owner_live boolean, token bigint, created_at bigint,
	updated_at bigint, settled_at bigint, adopted_from bigint, adopted_at bigint);

-- Creates a record owned by p_session. A retry with the same content by the
-- same session answers the record (created = false); any other put of an
-- existing (kind, key) is refused. p_permit, when given, must be a permit
-- of the caller's own that still counts.
CREATE FUNCTION pgcoord.record_put(p_kind text, p_key text, p_state text, p_data bytea,
	p_permit text, p_session bigint, p_actor text)
RETURNS pgcoord.record_put_result
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.record_put_result;
	v_created boolean;
	v_replica text;
	v_p pgcoord.permits;
	v_r pgcoord.records;
	v_e pgcoord.record_events;
BEGIN
	IF NOT pgcoord.session_lock_live(p_session) THEN
		RAISE EXCEPTION 'session % is no longer live; open a new one', p_session
		USING ERRCODE = 'PCSEX';
	END IF;
	SELECT s.replica_id INTO v_replica FROM pgcoord.sessions s WHERE s.id = p_session;
	IF p_permit IS NOT NULL THEN
		SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_permit;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'no permit "%"', p_permit USING ERRCODE = 'PCNFD';
		END IF;
		IF v_p.state = 'released' THEN
			RAISE EXCEPTION 'permit "%" was released at %; a record names a permit its '
				'work still holds', p_permit, pgcoord.iso_ms(v_p.released_at)
			USING ERRCODE = 'PCCFL';
		END IF;
		IF v_p.owner_session IS DISTINCT FROM p_session THEN
			RAISE EXCEPTION 'permit "%" is owned by session %; a record names a permit '
				'of its own session', p_permit,
				coalesce(v_p.owner_session::text, 'none (operator)')
			USING ERRCODE = 'PCFBD';
		END IF;
	END IF;

	-- A concurrent put of the same (kind, key) waits here on our insert
	-- and then finds the row: one owner per record.
	INSERT INTO pgcoord.records AS r (kind, key, state, data, permit_id, owner_session,
		owner_replica, token)
	VALUES (p_kind, p_key, p_state, p_data, p_permit, p_session, v_replica,
		nextval('pgcoord.token_seq'))
	ON CONFLICT ON CONSTRAINT records_pkey DO NOTHING
	RETURNING * INTO v_r;
	v_created := FOUND;
	IF v_created THEN
		INSERT INTO pgcoord.record_events (kind, key, event, actor, to_session, token, state)
		VALUES (p_kind, p_key, 'put', p_actor, p_session, v_r.token, p_state);
	ELSE
		SELECT * INTO v_r FROM pgcoord.records r WHERE r.kind = p_kind AND r.key = p_key;
	END IF;
	IF v_created OR (v_r.owner_session = p_session AND NOT v_r.terminal
			 AND v_r.state = p_state AND v_r.data IS NOT DISTINCT FROM p_data
			 AND v_r.permit_id IS NOT DISTINCT FROM p_permit) THEN
		SELECT v_created, s.* INTO v_result FROM pgcoord.record_status s
		WHERE s.kind = p_kind AND s.key = p_key;
		RETURN v_result;
	END IF;

	IF v_r.owner_session = p_session AND NOT v_r.terminal THEN
		RAISE EXCEPTION 'record %/% exists with other content; change it with record.update',
			p_kind, p_key
		USING ERRCODE = 'PCCFL';
	END IF;
	IF v_r.owner_session <> p_session THEN
		SELECT * INTO v_e FROM pgcoord.record_events e
		WHERE e.kind = p_kind AND e.key = p_key AND e.event = 'adopt'
		  AND e.from_session = p_session
		ORDER BY e.id DESC LIMIT 1;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'record %/% already exists, owned by session %@%', p_kind,
				p_key, v_r.owner_session, v_r.owner_replica
			USING ERRCODE = 'PCCFL';
		END IF;
	END IF;
	-- adopted away from the caller, or settled
	PERFORM pgcoord.record_refuse(p_kind, p_key, p_session, NULL, 'put');
END $$;

-- The owner changes its record's state and/or data (NULL keeps either).
CREATE FUNCTION pgcoord.record_update(p_kind text, p_key text, p_state text, p_data bytea,
	p_token bigint, p_session bigint, p_lost boolean, p_actor text)
RETURNS SETOF pgcoord.record_status
LANGUAGE plpgsql AS $$
DECLARE
	v_token bigint;
	v_state text;
BEGIN
	-- Fencing, in one conditional UPDATE: only the owner, only while it is
	-- live and its agent has not declared it lost, only while the record is
	-- open. A recovery adopting the record locks the same row; whichever
	-- commits second is re-checked on the other's row version (READ
	-- COMMITTED), so a former owner can never overwrite an adopter's work.
	UPDATE pgcoord.records r
	SET state = coalesce(p_state, r.state), data = coalesce(p_data, r.data),
	    updated_at = now()
	WHERE r.kind = p_kind AND r.key = p_key AND r.owner_session = p_session
	  AND NOT r.terminal AND (p_token IS NULL OR r.token = p_token)
	  AND NOT p_lost AND pgcoord.session_is_live(p_session)
	RETURNING r.token, r.state INTO v_token, v_state;
	IF NOT FOUND THEN
		PERFORM pgcoord.record_refuse(p_kind, p_key, p_session, p_token, 'update');
	END IF;
	INSERT INTO pgcoord.record_events (kind, key, event, actor, to_session, token, state)
	VALUES (p_kind, p_key, 'update', p_actor, p_session, v_token, v_state);
	RETURN QUERY SELECT s.* FROM pgcoord.record_status s
	WHERE s.kind = p_kind AND s.key = p_key;
END $$;

-- The owner ends its record in a terminal state; nothing changes it after.
CREATE FUNCTION pgcoord.record_settle(p_kind text, p_key text, p_state text, p_token bigint,
	p_session bigint, p_lost boolean, p_actor text)
RETURNS SETOF pgcoord.record_status
LANGUAGE plpgsql AS $$
DECLARE
	v_token bigint;
BEGIN
	-- the same fencing predicate as record_update
	UPDATE pgcoord.records r
	SET state = p_state, terminal = true, settled_at = now(), updated_at = now()
	WHERE r.kind = p_kind AND r.key = p_key AND r.owner_session = p_session
	  AND NOT r.terminal AND (p_token IS NULL OR r.token = p_token)
	  AND NOT p_lost AND pgcoord.session_is_live(p_session)
	RETURNING r.token INTO v_token;
	IF NOT FOUND THEN
		PERFORM pgcoord.record_refuse(p_kind, p_key, p_session, p_token, 'settle');
	END IF;
	INSERT INTO pgcoord.record_events (kind, key, event, actor, to_session, token, state)
	VALUES (p_kind, p_key, 'settle', p_actor, p_session, v_token, p_state);
	RETURN QUERY SELECT s.* FROM pgcoord.record_status s
	WHERE s.kind = p_kind AND s.key = p_key;
END $$;

-- What record_recover and record_recover_preview answer: one row per
-- record (adopted, or that would be), with its permit as it is after the
-- call; one row with NULL record columns when there is none. Every row
-- carries the totals.
CREATE TYPE pgcoord.record_recovery AS (
	now_at         bigint,
	left_alone     bigint,   -- open records of those kinds whose owner is live (not the caller)
	remaining      bigint,   -- open records of dead owners this call did not take
	kind text, key text, state text, terminal boolean, data_hex text, permit_id text,
	owner_session bigint, owner_replica text, owner_live boolean, token bigint,
	created_at bigint, updated_at bigint, settled_at bigint, adopted_from bigint,
	adopted_at bigint,
	permit_state   text,
	permit_phase   text,
	permit_token   bigint,
	permit_owner   bigint,
	permit_reason  text
);

-- record_recover and its dry run, for the caller p_uid (NULL: an admin,
-- every uid): only records whose dead owner had the caller's uid are
-- adopted; other uids' dead owners' records count in left_alone, and
-- remaining counts only what the caller could still take. A call takes no
-- more records than fit a reply of p_max_bytes (the agent's reply budget):
-- the rest count in remaining.
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
			PERFORM pgcoord.on_sessions_ended(v_closed, 'owner session expired', 'lapsed');
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

	-- (the permit's columns are domains: RETURN QUERY wants the declared text)
	RETURN QUERY
	SELECT pgcoord.ms(now()), v_left, v_remaining, s.*, p.state::text, p.phase::text,
	       p.token, p.owner_session, p.uncertain_reason
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
	SELECT pgcoord.ms(now()), t.left_alone, t.remaining, s.*, p.state::text, p.phase::text,
	       p.token, p.owner_session, p.uncertain_reason
	FROM totals t
	LEFT JOIN (pgcoord.record_status s LEFT JOIN pgcoord.permits p ON p.id = s.permit_id)
	  ON (s.kind, s.key) IN (SELECT c.kind, c.key FROM cand c)
	ORDER BY s.kind, s.key
$$;

SELECT pgcoord.secure_functions();
