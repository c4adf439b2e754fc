-- Permits: the fleet-wide quota ledger (guarantees 1–6).
--
-- A quota is one counter row; a permit is one client-named grant of weight
-- on one or more quotas. Every RPC is one call of one function below, so each
-- is its own transaction and nothing stays open across a client round trip.
--
-- Lock order, everywhere, so no two of these functions can deadlock: session
-- rows first (a claim holds its own FOR KEY SHARE, see session_lock_live; a
-- session's end updates it before any consequence), then quota
-- rows in key order (keys collate "C", bytewise, as the agent sorts them),
-- then existing permit rows in id order. A claim locks the permit row it
-- inserts before its quota rows; nobody else can wait on that new row except
-- a duplicate claim of the same id, which holds nothing yet.
--
-- The cost of a claim and a release does not grow with the tables:
-- * the claim and release functions run with enable_seqscan off, so every
--   plan they make (also a generic one made while the tables were empty) is
--   index-based: each statement in them has an index that answers it by key;
-- * no index reads the audit trail or the shares by quota key (the
--   conservation check aggregates the audit whole and reaches shares from
--   the open permits, and the agent reads both by permit), and a
--   permit's quota shares have no foreign keys: the claim writes the shares
--   itself, in the transaction that inserted that permit row and updated
--   that quota row, nothing deletes a quota, and both deletes of permits
--   (the retention purge, a retired id's tombstone in permit_claim_as) take
--   only permits without shares;
-- * no subtransaction on a claim's common path: a denial undoes by hand
--   what the claim did before it;
-- * quota rows are updated on every claim and release and no index covers
--   in_flight: with room left on their page (fillfactor) those updates are
--   HOT.
--
-- Group admission: the claims, or the releases, that wait in one agent at
-- the same moment go to the database as one statement, so they share one
-- transaction and one commit flush. Each group function takes one array per
-- argument of its single-call function (element i for member i, in arrival
-- order) and answers one row per member: (member, sqlstate, message) and
-- then exactly the single call's columns. Each member gets the answer, the
-- idempotency by id, the audit rows, the fencing token and the uid checks
-- it would have had alone. The common members are judged together,
-- set-based: each touched quota row is updated once per group, and the
-- permit, share and audit rows go in with one insert each (see
-- permit_claim_group and permit_release_group below). The rare ones (a
-- retry, a refusal, a per-call limit) are judged by the single-call
-- function itself (permit_claim_as, permit_release_as), each in a
-- subtransaction of its own in a group of two or more: an error it raises
-- rolls back only its own part and comes back as its sqlstate and message.
-- An error in the set-based part, and a statement timeout, roll the whole
-- group back; the agent answers every member retryably.
--
-- Locks outlive one call, until the group commits, so two groups can wait
-- on each other where two lone calls could not. Postgres detects it and
-- stops one member (whose part alone rolls back, 40P01: the agent sends
-- that member again in its next group, groups.c) or the whole statement.

-- The single-column checks of quotas and permits are domains: a domain's
-- check runs where a value is written to such a column (an insert, or an
-- update that sets it), from the type cache. A table CHECK, by contrast,
-- is parsed again from its stored text by every statement that writes the
-- table and runs on every column of each row it writes, the unchanged ones
-- too (PostgreSQL 15): the eight of permits cost an UPDATE of one row about
-- as much again as the update itself. The rules are the same ones, enforced
-- by Postgres on every write as before, with the same error (23514,
-- check_violation) for a value out of range from any caller; only the
-- checks that tie two columns together stay table CHECKs, in one.
CREATE DOMAIN pgcoord.quota_key AS text COLLATE "C"
	CHECK (octet_length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN pgcoord.quota_limit AS integer CHECK (VALUE >= 0);
-- guarantee 2's counter never goes below zero
CREATE DOMAIN pgcoord.quota_in_flight AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN pgcoord.lapse_seconds AS integer CHECK (VALUE > 0);
CREATE DOMAIN pgcoord.permit_id AS text COLLATE "C"
	CHECK (octet_length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN pgcoord.permit_state AS text CHECK (VALUE IN ('held', 'uncertain', 'released'));
CREATE DOMAIN pgcoord.permit_phase AS text
	CHECK (VALUE IN ('reserved', 'dispatched', 'running'));
CREATE DOMAIN pgcoord.permit_on_owner_loss AS text CHECK (VALUE IN ('uncertain', 'release'));
CREATE DOMAIN pgcoord.permit_intent AS bytea CHECK (octet_length(VALUE) <= 65536);
CREATE DOMAIN pgcoord.permit_weight AS integer CHECK (VALUE >= 1);

CREATE TABLE pgcoord.quotas (
	key           pgcoord.quota_key PRIMARY KEY,
	"limit"       pgcoord.quota_limit NOT NULL,
	-- sum of the weights of this quota's permits that are not released
	-- (guarantee 2); moved only by admission and release, in the same
	-- transaction as the permit rows that explain it
	in_flight     pgcoord.quota_in_flight NOT NULL DEFAULT 0,
	-- opt-in: the janitor releases permits uncertain for longer than this
	lapse_after_s pgcoord.lapse_seconds,
	created_at    timestamptz NOT NULL DEFAULT now(),
	updated_at    timestamptz NOT NULL DEFAULT now(), -- last change of limit or lapse_after_s
	-- the queued waiting claims on this quota (see the waiting claims)
	waiting       integer NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

CREATE TABLE pgcoord.permits (
	id               pgcoord.permit_id PRIMARY KEY,
	token            bigint NOT NULL, -- from token_seq: fleet-wide fencing number
	-- NULL only after an operator asserted "running" without a session of
	-- its own: the permit then counts until an operator releases it
	owner_session    bigint,
	owner_replica    text,
	-- released rows stay as tombstones so a very late duplicate claim of
	-- the same id can never be admitted twice (guarantee 3)
	state            pgcoord.permit_state NOT NULL,
	phase            pgcoord.permit_phase NOT NULL,
	on_owner_loss    pgcoord.permit_on_owner_loss NOT NULL,
	intent           pgcoord.permit_intent,
	uncertain_reason text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	phase_at         timestamptz NOT NULL DEFAULT now(),
	state_at         timestamptz NOT NULL DEFAULT now(),
	released_at      timestamptz,
	-- the share of a permit of one quota, in its own row (see permit_quotas)
	quota_key        text COLLATE "C",
	quota_weight     pgcoord.permit_weight,
	-- one CHECK, not two: each is parsed per writing statement (above)
	CHECK ((state = 'released') = (released_at IS NOT NULL)
		AND (quota_key IS NULL) = (quota_weight IS NULL))
);

CREATE INDEX permits_open_by_owner ON pgcoord.permits (owner_session)
	WHERE state <> 'released';

CREATE INDEX permits_uncertain ON pgcoord.permits (state_at) WHERE state = 'uncertain';

-- The weights that count: a permit's share of each quota it holds, read as
-- the view permit_quotas. Most permits name one quota: that share is in the
-- permit's own row (quota_key, quota_weight), so their claim writes no row
-- and no index entry for it; the shares of a permit of two or more quotas
-- are rows of permit_quotas_multi (and its share columns stay NULL). A
-- permit has its shares in one place or the other, never both. No foreign
-- keys: see the top of this file. Read by permit only: no index by key,
-- since every share by key that counts belongs to an open permit, and those
-- are reached through permits_open_by_owner (quota_status, permits_check).
CREATE TABLE pgcoord.permit_quotas_multi (
	permit_id text COLLATE "C" NOT NULL,
	key       text COLLATE "C" NOT NULL,
	weight    integer NOT NULL CHECK (weight >= 1),
	PRIMARY KEY (permit_id, key)
);

-- Every share, wherever it is kept: a read by permit_id is a lookup by
-- permits_pkey, and by permit_quotas_multi_pkey only for a permit without
-- a share in its row. (Written as a lateral join, not as a UNION ALL of
-- the two tables: the planner cannot push a join on permit_id into a
-- UNION ALL branch that has a WHERE clause, and would scan every permit.)
CREATE VIEW pgcoord.permit_quotas AS
	SELECT p.id AS permit_id, s.key, s.weight
	FROM pgcoord.permits p
	CROSS JOIN LATERAL (
		SELECT p.quota_key AS key, p.quota_weight AS weight WHERE p.quota_key IS NOT NULL
		UNION ALL
		SELECT m.key, m.weight FROM pgcoord.permit_quotas_multi m
		WHERE p.quota_key IS NULL AND m.permit_id = p.id) s;

-- A share written by hand (tests, repairs) goes in as a row of
-- permit_quotas_multi, which every reader sees the same.
CREATE FUNCTION pgcoord.permit_quotas_insert()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
	VALUES (NEW.permit_id, NEW.key, NEW.weight);
	RETURN NEW;
END $$;

CREATE TRIGGER permit_quotas_insert INSTEAD OF INSERT ON pgcoord.permit_quotas
	FOR EACH ROW EXECUTE FUNCTION pgcoord.permit_quotas_insert();

-- What an audit row records: the kinds of event, as a domain rather than a
-- CHECK of the table. PostgreSQL 15 re-parses a table's CHECK expressions
-- each time a statement starts writing it; a domain's are parsed once per
-- connection and cached. The writers (the functions of this series) name
-- only these; a domain over text leaves their INSERTs and every reader's
-- text as they are (a client is told the column is text).
CREATE DOMAIN pgcoord.permit_event_kind AS text
	CHECK (VALUE IN ('admitted', 'limit_set', 'phase', 'uncertain', 'adopted', 'released',
		'resolved_gone', 'override_released', 'owner_lost_released', 'lapsed', 'retired'));

-- The audit trail (guarantee 6): one row per state change, written in the
-- same transaction as the change. Rows that move a counter carry the quota
-- and the signed delta, so sum(delta) per key must equal in_flight.
--
-- Two indexes, one b-tree entry per row. An id is unique because only its
-- sequence writes it (no writer names the column; the soak checker, which
-- reads every row, verifies it), so it has no b-tree of its own: the
-- readers of ids in order from a point (the fold and permits_check, 0005,
-- which read past folded_upto) use a BRIN index. Ids only grow, so the
-- rows past a point lie in the last few block ranges, and a row inserted
-- into a range not yet summarized writes nothing to it; the fold summarizes
-- the ranges behind the table's last one (0005). Every other reader goes by
-- permit: permit_events_by_permit.
CREATE TABLE pgcoord.permit_events (
	id        bigserial,
	permit_id text COLLATE "C",          -- NULL for quota events (limit_set)
	key       text COLLATE "C",          -- NULL for events not tied to one quota
	delta     bigint NOT NULL DEFAULT 0,
	event     pgcoord.permit_event_kind NOT NULL,
	actor     text NOT NULL,
	reason    text,                      -- reason or evidence
	state     text,                      -- the permit's state after the event
	phase     text,
	at        timestamptz NOT NULL DEFAULT now()
);

-- Small ranges (8 blocks, some 500 rows): a read past a point reads at most
-- the unsummarized tail and a range or two of rows it does not want.
CREATE INDEX permit_events_by_id ON pgcoord.permit_events USING brin (id)
	WITH (pages_per_range = 8);

CREATE INDEX permit_events_by_permit ON pgcoord.permit_events (permit_id, id)
	WHERE permit_id IS NOT NULL;

-- What a permit is right now. A held permit whose owner session is no
-- longer live is uncertain (guarantee 5) even before the janitor or the
-- session-end hook has written that down: nobody confirms it still runs.
CREATE VIEW pgcoord.permit_status AS
	SELECT p.*,
	       CASE WHEN p.state = 'held' AND p.owner_session IS NOT NULL
			 AND NOT pgcoord.session_is_live(p.owner_session)
		    THEN 'uncertain' ELSE p.state END AS effective_state,
	       CASE WHEN p.state = 'held' AND p.owner_session IS NOT NULL
			 AND NOT pgcoord.session_is_live(p.owner_session)
		    THEN 'owner session ' || p.owner_session || ' is no longer live'
		    ELSE p.uncertain_reason END AS effective_reason
	FROM pgcoord.permits p;

-- What quota_apply and quota_set answer: the quota after the change, the
-- limit it had before (NULL when it was created).
CREATE TYPE pgcoord.quota_change AS (key text, "limit" integer, in_flight bigint,
	lapse_after_s integer, previous_limit integer, created boolean, now_at bigint);

-- Sets a quota's limit (and lapse_after_s: NULL keeps it, 0 turns it off),
-- creating the quota when missing. Audited as 'limit_set' when something
-- changed. Lowering a limit below in_flight is allowed: admission's
-- predicate then refuses everything until in_flight falls below it.
CREATE FUNCTION pgcoord.quota_apply(p_key text, p_limit integer, p_lapse_after_s integer,
	p_actor text, p_why text)
RETURNS pgcoord.quota_change
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.quota_change;
	v_q pgcoord.quotas;
	v_lapse integer;
	v_created boolean := false;
BEGIN
	LOOP
		SELECT * INTO v_q FROM pgcoord.quotas q WHERE q.key = p_key FOR NO KEY UPDATE;
		EXIT WHEN FOUND;
		INSERT INTO pgcoord.quotas (key, "limit") VALUES (p_key, p_limit)
		ON CONFLICT (key) DO NOTHING;
		IF FOUND THEN
			v_created := true;
			SELECT * INTO v_q FROM pgcoord.quotas q WHERE q.key = p_key;
			-- the new row carries p_limit already; record it like a change
			v_q."limit" := NULL;
			EXIT;
		END IF;
		-- a concurrent insert won: lock its row on the next turn
	END LOOP;
	v_lapse := CASE WHEN p_lapse_after_s IS NULL THEN v_q.lapse_after_s
			WHEN p_lapse_after_s = 0 THEN NULL ELSE p_lapse_after_s END;
	IF v_created OR v_q."limit" IS DISTINCT FROM p_limit
	   OR v_q.lapse_after_s IS DISTINCT FROM v_lapse THEN
		UPDATE pgcoord.quotas q SET "limit" = p_limit, lapse_after_s = v_lapse,
			updated_at = now()
		WHERE q.key = p_key;
		INSERT INTO pgcoord.permit_events (key, event, actor, reason)
		VALUES (p_key, 'limit_set', p_actor,
			format('limit %s -> %s, lapse_after_s %s -> %s%s',
			       coalesce(v_q."limit"::text, 'none'), p_limit,
			       coalesce(v_q.lapse_after_s::text, 'off'), coalesce(v_lapse::text, 'off'),
			       coalesce(' (' || p_why || ')', '')));
	END IF;
	SELECT q.key::text, q."limit", q.in_flight, q.lapse_after_s, v_q."limit", v_created,
	       pgcoord.ms(now())
	INTO v_result
	FROM pgcoord.quotas q WHERE q.key = p_key;
	RETURN v_result;
END $$;

-- quota.set: quota_apply for an operator, with no reason beside the actor.
CREATE FUNCTION pgcoord.quota_set(p_key text, p_limit integer, p_lapse_after_s integer,
	p_actor text)
RETURNS pgcoord.quota_change
LANGUAGE sql AS $$
	SELECT * FROM pgcoord.quota_apply(p_key, p_limit, p_lapse_after_s, p_actor, NULL)
$$;

-- One snapshot of quotas with how much of in_flight is held by live owners
-- and how much is uncertain (one statement, so the numbers agree). The
-- shares are found from the open permits (permits_open_by_owner), not by
-- key: its cost grows with the permits open now, not with history.
CREATE VIEW pgcoord.quota_status AS
	SELECT q.key, q."limit", q.in_flight, q.lapse_after_s, q.created_at, q.updated_at,
	       coalesce(sum(o.weight) FILTER (WHERE o.effective_state = 'held'), 0) AS held,
	       coalesce(sum(o.weight) FILTER (WHERE o.effective_state = 'uncertain'), 0)
		AS uncertain,
	       count(o.id) FILTER (WHERE o.effective_state <> 'released') AS permits
	FROM pgcoord.quotas q
	LEFT JOIN (SELECT p.id, p.effective_state, pq.key, pq.weight
		   FROM pgcoord.permit_status p
		   JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id
		   WHERE p.state <> 'released') o ON o.key = q.key
	GROUP BY q.key;

-- Locks, in key order, the quota rows a set of permits holds weight on.
-- Every release takes these before the permit rows (see the lock order at
-- the top), so two releases of one permit serialize here and the second
-- finds it released.
CREATE FUNCTION pgcoord.permits_lock_quotas(p_ids text[])
RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
	PERFORM 1 FROM pgcoord.quotas q
	WHERE q.key = ANY (ARRAY(SELECT DISTINCT pq.key FROM pgcoord.permit_quotas pq
				 WHERE pq.permit_id = ANY (p_ids)))
	ORDER BY q.key
	FOR NO KEY UPDATE OF q;
END $$;

-- Releases permits the caller has locked (quotas, then permit rows) and
-- re-checked: each leaves exactly once, because only rows still not
-- released change, and the counters drop by exactly the weights of the rows
-- that changed, in the same transaction (guarantees 2 and 5). One audit row
-- per permit and quota, with the negative delta. p_actor NULL means the
-- agent that served the owner ('agent@<replica>'). Returns how many left.
CREATE FUNCTION pgcoord.permits_release_locked(p_ids text[], p_event text,
	p_actor text, p_reason text)
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_done text[];
	v_key text;
	v_w bigint;
BEGIN
	WITH r AS (
		UPDATE pgcoord.permits p SET state = 'released', released_at = now(),
			state_at = now()
		WHERE p.id = ANY (p_ids) AND p.state <> 'released'
		RETURNING p.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_done FROM r;
	IF cardinality(v_done) = 0 THEN
		RETURN 0;
	END IF;
	FOR v_key, v_w IN
		SELECT pq.key, sum(pq.weight) FROM pgcoord.permit_quotas pq
		WHERE pq.permit_id = ANY (v_done) GROUP BY pq.key ORDER BY pq.key
	LOOP
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - v_w WHERE q.key = v_key;
	END LOOP;
	INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason, state, phase)
	SELECT p.id, pq.key, -pq.weight, p_event,
	       coalesce(p_actor, 'agent@' || coalesce(p.owner_replica, '?')), p_reason,
	       'released', p.phase
	FROM pgcoord.permits p JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id
	WHERE p.id = ANY (v_done)
	ORDER BY p.id, pq.key;
	RETURN cardinality(v_done);
END $$;

-- Admission (guarantees 1, 3, 4, 6). p_keys must be sorted (bytewise) and
-- distinct; p_weights pairs with them. Statuses:
--   admitted        a new permit; its counters moved by its weights
--   held            the id exists: the original grant, nothing changed
--   denied          a quota had no room (denied_*); nothing changed
--   unknown_quota   denied_key has no quota row and no limit was given
--   released        the id names a released permit (a tombstone)
--   mismatch        the id exists with other quotas or weights
--   session_expired the claiming session is not live
--   invalid         keys not sorted/distinct, or a limit with several keys
-- What a claim decides, for permit_claim, permit_claim_as, permit_wait
-- (0006_waiting_claims.sql) and each member of a claim group:
-- admitted and held (a retry of a held id) grant it (token, state, phase,
-- owner, created_at); denied names the first quota without room (denied_*);
-- unknown_quota names the first key with no quota row (denied_key; a
-- decision, not a raise: the claim drew a fencing token, and a group's
-- set-based part answers it too); queued is a waiting claim (owner,
-- position, queued_at, deadline_at). Every other answer is a refusal that
-- changes nothing and raises: PCINV (keys), PCSEX (the session is not
-- live), PCCFL (the id was released or retired, or names other quotas).
CREATE TYPE pgcoord.claim_status AS ENUM ('admitted', 'held', 'queued', 'denied',
	'unknown_quota');
CREATE TYPE pgcoord.claim_decision AS (status pgcoord.claim_status, token bigint,
	state text, phase text, owner_session bigint, owner_replica text, created_at bigint,
	released_at bigint, denied_key text, denied_limit integer, denied_in_flight bigint,
	now_at bigint, "position" bigint, queued_at bigint, deadline_at bigint);

-- The refusal of a claim whose session is not live (PCSEX): raised by a
-- lone claim, answered in its row by a claim group's set-based part.
CREATE FUNCTION pgcoord.claim_session_expired()
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
	SELECT 'this connection''s session is no longer live in the database; open a new one'
$$;

-- A claim for the caller p_uid (the agent's lone claim, and each member a
-- claim group judges alone):
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
--   A NULL p_uid (permit_claim) sets no retirement aside.
--
-- Its cost is that of its statements: every SECURITY DEFINER call is a
-- frame with a GUC save and restore of its own (0001_security.sql), so the
-- whole claim runs here, with no nested pgcoord call on its common path
-- (helpers such as ms() and session_lock_live are written out), and
-- everything the common path does not need (the sort check of one key,
-- the limit's quota probe, the retired-id probe) is skipped by a plain
-- expression, which PL/pgSQL evaluates without starting the executor.
CREATE FUNCTION pgcoord.permit_claim_as(p_uid bigint, p_admin boolean, p_id text,
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
	SELECT string_agg(pq.key || ':' || pq.weight, ',' ORDER BY pq.key) INTO v_quotas
	FROM pgcoord.permit_quotas pq WHERE pq.permit_id = p_id;
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

-- A claim with no caller uid: an admin's limit, and no retirement set aside.
CREATE FUNCTION pgcoord.permit_claim(p_id text, p_keys text[], p_weights integer[],
	p_session bigint, p_replica text, p_on_owner_loss text, p_intent bytea,
	p_limit integer, p_actor text)
RETURNS pgcoord.claim_decision
LANGUAGE plpgsql AS $$
BEGIN
	RETURN pgcoord.permit_claim_as(NULL, true, p_id, p_keys, p_weights, p_session,
		p_replica, p_on_owner_loss, p_intent, p_limit, p_actor);
END $$;

-- The lifecycle functions below (update, mark_uncertain, resolve) answer
-- one permit_change; permit_release answers one release_decision. A
-- refusal changes nothing and raises its SQLSTATE (migrations/README.md)
-- with the client's message; every refusal branch comes before the
-- function's first write (row locks only), so the raise loses nothing.
CREATE TYPE pgcoord.permit_change AS (changed boolean, state text, phase text,
	phase_at bigint, state_at bigint, owner_session bigint, detail text, now_at bigint);

-- released: this call released it; already_released: it was (release is
-- idempotent); retired: there was no permit, and the call retired the id
-- (a write, so an answer rather than a raise).
CREATE TYPE pgcoord.release_status AS ENUM ('released', 'already_released', 'retired');
CREATE TYPE pgcoord.release_decision AS (status pgcoord.release_status, state text,
	released_at bigint, now_at bigint);

-- Refuses p_verb on permit p_id because p_why (PCFBD), naming who may.
CREATE FUNCTION pgcoord.permit_forbid(p_verb text, p_id text, p_why text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'cannot % permit "%": %; only % may', p_verb, p_id, p_why,
		CASE p_verb
		WHEN 'release' THEN 'its owner, or an admin with override: true'
		WHEN 'resolve' THEN 'its owner, a session of its uid once it is uncertain, '
			'or an admin (with override: true while its owner is live)'
		ELSE 'its owner' END
		USING ERRCODE = 'PCFBD';
END $$;

-- The _as functions' uid check: a permit answers to the uid of its owner
-- session; another uid's permit is admin work.
CREATE FUNCTION pgcoord.permit_check_uid(p_uid bigint, p_id text, p_verb text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	v_owner bigint;
BEGIN
	SELECT pgcoord.session_owner_uid(p.owner_session) INTO v_owner
	FROM pgcoord.permits p WHERE p.id = p_id;
	IF FOUND AND v_owner IS DISTINCT FROM p_uid THEN
		PERFORM pgcoord.permit_forbid(p_verb, p_id, format('it belongs to uid %s; %s '
			'another uid''s permit needs admin', coalesce(v_owner::text, 'none'),
			CASE p_verb WHEN 'release' THEN 'releasing' ELSE 'resolving' END));
	END IF;
END $$;

-- The owner moves its permit forward: reserved -> dispatched -> running.
CREATE FUNCTION pgcoord.permit_update(p_id text, p_session bigint, p_phase text, p_actor text)
RETURNS pgcoord.permit_change
LANGUAGE plpgsql AS $$
DECLARE
	v_p pgcoord.permits;
	v_old integer;
	v_new integer;
BEGIN
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no permit "%"', p_id USING ERRCODE = 'PCNFD';
	END IF;
	IF v_p.state = 'released' THEN
		RAISE EXCEPTION 'cannot update permit "%": it was released at %', p_id,
			pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_p.owner_session IS DISTINCT FROM p_session THEN
		PERFORM pgcoord.permit_forbid('update', p_id, 'it is owned by session ' ||
			coalesce(v_p.owner_session::text, 'none (operator)'));
	END IF;
	IF v_p.state = 'uncertain' THEN
		RAISE EXCEPTION 'cannot update permit "%": it is uncertain: resolve it first', p_id
			USING ERRCODE = 'PCCFL';
	END IF;
	v_old := array_position(ARRAY['reserved', 'dispatched', 'running'], v_p.phase);
	v_new := array_position(ARRAY['reserved', 'dispatched', 'running'], p_phase);
	IF v_new IS NULL THEN
		RAISE EXCEPTION 'cannot update permit "%": unknown phase', p_id
			USING ERRCODE = 'PCINV';
	END IF;
	IF v_new < v_old THEN
		RAISE EXCEPTION 'cannot update permit "%": phase moves forward only (reserved, '
			'dispatched, running) and it is %', p_id, v_p.phase USING ERRCODE = 'PCCFL';
	END IF;
	IF v_new = v_old THEN
		RETURN (false, v_p.state, v_p.phase, pgcoord.ms(v_p.phase_at), NULL, NULL, NULL,
			pgcoord.ms(now()))::pgcoord.permit_change;
	END IF;
	UPDATE pgcoord.permits p SET phase = p_phase, phase_at = now() WHERE p.id = p_id;
	INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state, phase)
	VALUES (p_id, 'phase', p_actor, v_p.phase || ' -> ' || p_phase, v_p.state, p_phase);
	RETURN (true, v_p.state, p_phase, pgcoord.ms(now()), NULL, NULL, NULL,
		pgcoord.ms(now()))::pgcoord.permit_change;
END $$;

-- The owner says it lost sight of the work (a connector dropped before it
-- confirmed): the permit keeps counting, visibly uncertain (guarantee 5).
CREATE FUNCTION pgcoord.permit_mark_uncertain(p_id text, p_session bigint, p_reason text,
	p_actor text)
RETURNS pgcoord.permit_change
LANGUAGE plpgsql AS $$
DECLARE
	v_p pgcoord.permits;
BEGIN
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no permit "%"', p_id USING ERRCODE = 'PCNFD';
	END IF;
	IF v_p.state = 'released' THEN
		RAISE EXCEPTION 'cannot mark uncertain permit "%": it was released at %', p_id,
			pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
	END IF;
	IF v_p.owner_session IS DISTINCT FROM p_session THEN
		PERFORM pgcoord.permit_forbid('mark uncertain', p_id, 'it is owned by session ' ||
			coalesce(v_p.owner_session::text, 'none (operator)'));
	END IF;
	IF v_p.state = 'uncertain' THEN
		RETURN (false, v_p.state, NULL, NULL, pgcoord.ms(v_p.state_at), NULL, NULL,
			pgcoord.ms(now()))::pgcoord.permit_change;
	END IF;
	UPDATE pgcoord.permits p SET state = 'uncertain', uncertain_reason = p_reason,
		state_at = now()
	WHERE p.id = p_id;
	INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state, phase)
	VALUES (p_id, 'uncertain', p_actor, p_reason, 'uncertain', v_p.phase);
	RETURN (true, 'uncertain', NULL, NULL, pgcoord.ms(now()), NULL, NULL,
		pgcoord.ms(now()))::pgcoord.permit_change;
END $$;

-- Ends a permit: by its owner (held only: an uncertain permit leaves by a
-- resolve with evidence), or by an operator override (any state). Releasing
-- a released permit is a no-op that says so (idempotent, guarantee 3).
--
-- A session releasing an id that has no permit retires the id: a released
-- tombstone with no quotas goes in, so an attempt of a claim still on its
-- way (its reply lost, then a retry refused) finds the id released instead
-- of taking a slot nobody will give back. The insert waits for a claim of
-- the id that is mid-transaction; if that one commits, it is released below
-- like any other. Operators' overrides never retire ids (a typo must not
-- burn one).
CREATE FUNCTION pgcoord.permit_release(p_id text, p_session bigint, p_override boolean,
	p_actor text, p_reason text)
RETURNS pgcoord.release_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_p pgcoord.permits;
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = p_id) THEN
		IF p_override OR p_session IS NULL THEN
			RAISE EXCEPTION 'no permit "%"', p_id USING ERRCODE = 'PCNFD';
		END IF;
		INSERT INTO pgcoord.permits AS p (id, token, owner_session, owner_replica, state,
			phase, on_owner_loss, released_at)
		SELECT p_id, nextval('pgcoord.token_seq'), p_session, s.replica_id, 'released',
			'reserved', 'uncertain', now()
		FROM pgcoord.sessions s WHERE s.id = p_session
		ON CONFLICT (id) DO NOTHING;
		IF FOUND THEN
			INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state,
				phase)
			VALUES (p_id, 'retired', p_actor, coalesce(p_reason,
				'released before any claim of it committed'), 'released', 'reserved');
			RETURN ('retired', 'released', pgcoord.ms(now()),
				pgcoord.ms(now()))::pgcoord.release_decision;
		END IF;
		-- a claim of the id committed while we waited: release it as usual
		-- (the insert above wrote nothing, so this may still refuse)
		IF NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = p_id) THEN
			RAISE EXCEPTION 'no permit "%"', p_id USING ERRCODE = 'PCNFD';
		END IF;
	END IF;
	PERFORM pgcoord.permits_lock_quotas(ARRAY[p_id]);
	SELECT * INTO v_p FROM pgcoord.permits p WHERE p.id = p_id FOR UPDATE;
	IF v_p.state = 'released' THEN
		RETURN ('already_released', v_p.state, pgcoord.ms(v_p.released_at),
			pgcoord.ms(now()))::pgcoord.release_decision;
	END IF;
	IF NOT p_override THEN
		IF v_p.owner_session IS DISTINCT FROM p_session THEN
			PERFORM pgcoord.permit_forbid('release', p_id, 'it is owned by session ' ||
				coalesce(v_p.owner_session::text, 'none (operator)'));
		END IF;
		IF v_p.state = 'uncertain' THEN
			RAISE EXCEPTION 'cannot release permit "%": it is uncertain (%): resolve it '
				'with evidence', p_id, coalesce(v_p.uncertain_reason, '?')
				USING ERRCODE = 'PCCFL';
		END IF;
	END IF;
	PERFORM pgcoord.permits_release_locked(ARRAY[p_id],
		CASE WHEN p_override THEN 'override_released' ELSE 'released' END, p_actor,
		p_reason);
	RETURN ('released', 'released', pgcoord.ms(now()),
		pgcoord.ms(now()))::pgcoord.release_decision;
END $$;

-- Settles an uncertain permit from observed evidence (guarantee 5):
-- 'running' hands it to the resolving session (NULL: an operator without a
-- session, who then answers for it), held again; 'gone' releases it. A
-- session may resolve permits that are uncertain (recorded, or because
-- their owner is no longer live) or its own; an override may resolve any.
CREATE FUNCTION pgcoord.permit_resolve(p_id text, p_session bigint, p_replica text,
	p_outcome text, p_evidence text, p_override boolean, p_actor text)
RETURNS pgcoord.permit_change
LANGUAGE plpgsql AS $$
DECLARE
	v_p pgcoord.permit_status;
	v_uncertain boolean;
BEGIN
	IF p_outcome NOT IN ('running', 'gone') OR coalesce(btrim(p_evidence), '') = '' THEN
		RAISE EXCEPTION 'cannot resolve permit "%": outcome running|gone and evidence are '
			'required', p_id USING ERRCODE = 'PCINV';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pgcoord.permits p WHERE p.id = p_id) THEN
		RAISE EXCEPTION 'no permit "%"', p_id USING ERRCODE = 'PCNFD';
	END IF;
	IF p_outcome = 'gone' THEN
		PERFORM pgcoord.permits_lock_quotas(ARRAY[p_id]);
	END IF;
	PERFORM 1 FROM pgcoord.permits p WHERE p.id = p_id FOR UPDATE;
	SELECT * INTO v_p FROM pgcoord.permit_status s WHERE s.id = p_id;
	IF v_p.state = 'released' THEN
		IF p_outcome <> 'gone' THEN
			RAISE EXCEPTION 'cannot resolve permit "%": it was released at %', p_id,
				pgcoord.ms(v_p.released_at) USING ERRCODE = 'PCCFL';
		END IF;
		RETURN (false, v_p.state, NULL, NULL, NULL, v_p.owner_session, 'already released',
			pgcoord.ms(now()))::pgcoord.permit_change;
	END IF;
	v_uncertain := v_p.effective_state = 'uncertain';
	IF NOT p_override AND NOT v_uncertain
	   AND v_p.owner_session IS DISTINCT FROM p_session THEN
		PERFORM pgcoord.permit_forbid('resolve', p_id, 'it is held by live session ' ||
			coalesce(v_p.owner_session::text, 'none (operator)'));
	END IF;
	IF p_outcome = 'gone' THEN
		PERFORM pgcoord.permits_release_locked(ARRAY[p_id],
			CASE WHEN p_override THEN 'override_released' ELSE 'resolved_gone' END,
			p_actor, 'gone: ' || p_evidence);
		RETURN (true, 'released', NULL, NULL, NULL, v_p.owner_session, NULL,
			pgcoord.ms(now()))::pgcoord.permit_change;
	END IF;
	IF v_p.state = 'held' AND v_p.owner_session IS NOT DISTINCT FROM p_session
	   AND NOT v_uncertain THEN
		RETURN (false, v_p.state, NULL, NULL, NULL, v_p.owner_session,
			'already held by this session', pgcoord.ms(now()))::pgcoord.permit_change;
	END IF;
	UPDATE pgcoord.permits p SET owner_session = p_session, owner_replica = p_replica,
		state = 'held', uncertain_reason = NULL, state_at = now()
	WHERE p.id = p_id;
	INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state, phase)
	VALUES (p_id, 'adopted', p_actor, format('running: %s (was %s, owner %s)', p_evidence,
		v_p.effective_state, coalesce(v_p.owner_session::text, 'none')), 'held', v_p.phase);
	RETURN (true, 'held', NULL, NULL, NULL, p_session, NULL,
		pgcoord.ms(now()))::pgcoord.permit_change;
END $$;

-- permit_release for the caller p_uid: without an override, only a permit
-- of the caller's own uid (the owner session check follows in
-- permit_release). An override is the agent's to allow (admins only).
CREATE FUNCTION pgcoord.permit_release_as(p_uid bigint, p_id text, p_session bigint,
	p_override boolean, p_actor text, p_reason text)
RETURNS pgcoord.release_decision
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
	IF NOT p_override THEN
		PERFORM pgcoord.permit_check_uid(p_uid, p_id, 'release');
	END IF;
	RETURN pgcoord.permit_release(p_id, p_session, p_override, p_actor, p_reason);
END $$;

-- permit_resolve for the caller p_uid: a non-admin resolves only permits
-- of its own uid (an uncertain permit of another uid is admin work).
CREATE FUNCTION pgcoord.permit_resolve_as(p_uid bigint, p_admin boolean, p_id text,
	p_session bigint, p_replica text, p_outcome text, p_evidence text, p_override boolean,
	p_actor text)
RETURNS pgcoord.permit_change
LANGUAGE plpgsql AS $$
BEGIN
	IF NOT p_admin THEN
		PERFORM pgcoord.permit_check_uid(p_uid, p_id, 'resolve');
	END IF;
	RETURN pgcoord.permit_resolve(p_id, p_session, p_replica, p_outcome, p_evidence,
		p_override, p_actor);
END $$;

-- A claim group of several members, in a fixed handful of statements,
-- with the same answers, permit rows, shares, counters and audit rows as
-- its members made one at a time. The common member (a fresh id, named
-- once in the group, valid sorted keys and weights, no per-call limit) is
-- judged in memory, so a hot key's row is updated once per group:
--
--   1. the session rows are locked, in session order, as session_lock_live
--      locks one; a member whose session is not live is answered
--      session_expired;
--   2. the permit rows of the others go in first, one multi-row insert in
--      arrival order (the lone claim's presence guard; fencing tokens are
--      drawn in arrival order, a denied claim's too, as a lone claim does);
--   3. every quota row they name is locked once, in key order;
--   4. the members are judged in arrival order against counters held in
--      memory, by the lone claim's predicate (every key has room for its
--      weight and nobody waits on it; a key with no quota row:
--      unknown_quota, at the first refusing key in key order, with that
--      quota's numbers then);
--   5. one UPDATE per quota row by the net weight admitted on it, the
--      denied members' permit rows out, the shares and audit rows of the
--      admitted ones in one insert each.
-- A quota with waiters admits no member in 4., so the UPDATE in 5. never
-- raises a row that has waiters: quotas_no_overtaking
-- (0006_waiting_claims.sql) never skips it, and never needs to.
--
-- Every other member (an id that exists: a retry, a retired id; an id the
-- group names twice; a per-call limit; input a lone call refuses or fails
-- on) is judged by permit_claim_as in a subtransaction of its own, after
-- the set-based members. Why that gives the answers of arrival order: a
-- claim's answer and writes depend only on the rows of its id, the quota
-- rows of its keys and whether its session is live. The ids of the two
-- parts differ (an id named twice goes alone, both times); a session that
-- was live stays live until commit (its row is locked) and one that was not
-- never comes back; and a set-based member that names a key some member
-- judged alone names is judged alone as well (the closure below), so the
-- two parts share no quota row. Within each part the order is arrival
-- order. Fencing tokens are in arrival order among members that share a
-- quota, which is where they are compared.
--
-- Input that does not parse (an array literal of keys or weights) sends the
-- whole group through the member-by-member loop, and so does an id that a
-- claim in flight elsewhere inserted between our look and our insert (the
-- insert skipped it: its rows are taken out again first). Both are rare.
--
-- Locks: session rows, then permit rows, then quota rows in key order, as
-- everywhere (the top of this file); the quota rows of the whole set-based
-- part in one key order, so two groups on shared hot keys do not lock them
-- in their members' arrival orders. An error in the set-based part (a
-- deadlock with a duplicate of one of its ids in flight elsewhere, a
-- lock_timeout) fails the statement, which the agent answers for every
-- member as a failed group (retry).
--
-- Cost: the frame around the members is a fixed handful of statements
-- (the members' check, the session locks, the permit insert, the quota
-- lock, the counters with the audit rows, the answers); the rare paths
-- (members judged alone, the closure, shares of two or more quotas) run
-- their statements only when a member needs them. The counters and the
-- audit rows come from the shares gathered while judging, so no member's
-- array literals are parsed again. Generic plans, always, as in
-- permit_release_group below: with custom plans PL/pgSQL re-planned the
-- counter UPDATE on every call (its generic plan looked dearer for an
-- array of unknown size). With sequential scans, hash and merge joins
-- off, every plan here probes a primary key (or sessions_open_by_id) per
-- member or key, on empty and on large tables alike (docs/PERFORMANCE.md).

-- The members p_members of a claim group, each by permit_claim_as in a
-- subtransaction of its own, in the order given (the member-by-member loop).
CREATE FUNCTION pgcoord.permit_claim_members(p_members integer[], p_uids bigint[],
	p_admins boolean[], p_ids text[], p_keys text[], p_weights text[], p_sessions bigint[],
	p_replicas text[], p_on_owner_loss text[], p_intents bytea[], p_limits integer[],
	p_actors text[])
RETURNS TABLE (member integer, err_state text, err_message text,
	status pgcoord.claim_status, token bigint, state text, phase text, owner_session bigint,
	owner_replica text, created_at bigint, released_at bigint, denied_key text,
	denied_limit integer, denied_in_flight bigint, now_at bigint, "position" bigint,
	queued_at bigint, deadline_at bigint)
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
			RETURN QUERY SELECT i, SQLSTATE::text, SQLERRM::text,
				(NULL::pgcoord.claim_decision).*;
		END;
	END LOOP;
END $$;

CREATE FUNCTION pgcoord.permit_claim_group(p_uids bigint[], p_admins boolean[],
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
			WHERE s.id = d.id AND s.closed_at IS NULL AND s.expires_at > now()
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
	-- the counters by the net weights judged above and the audit rows in
	-- one statement, from the shares gathered while judging (no member's
	-- keys parsed again); the shares of permits of two or more quotas (one
	-- is in the permit row) only when there are some
	WITH counters AS (
		UPDATE pgcoord.quotas q
		SET in_flight = q.in_flight + v_qd[array_position(v_qk, q.key::text)]
		WHERE q.key = ANY (v_qk) AND v_qd[array_position(v_qk, q.key::text)] <> 0)
	INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, state, phase)
	SELECT p_ids[a.m], a.k, a.w, 'admitted', p_actors[a.m], 'held', 'reserved'
	FROM unnest(v_am, v_ak, v_aw) WITH ORDINALITY AS a(m, k, w, o)
	ORDER BY a.o;
	IF cardinality(v_multi) > 0 THEN
		INSERT INTO pgcoord.permit_quotas_multi (permit_id, key, weight)
		SELECT p_ids[a.m], a.k, a.w FROM unnest(v_am, v_ak, v_aw) AS a(m, k, w)
		WHERE a.m = ANY (v_multi);
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

-- A release group, and a lone release (a group of one), in a fixed
-- handful of statements whatever the group's size, with the same answers,
-- audit rows and hand-overs as releases made one at a time.
--
-- The common release is a permit that is held by the calling session (of
-- the caller's uid), or any permit not yet released under an override. It
-- takes three statements: the quota rows of every member's permit are
-- locked in key order (the lock order at the top: quotas before permits),
-- then one statement releases every such permit that the guard lets
-- through, drops each quota once by the net weight, and writes the audit
-- rows in member order, then the answers. The permit rows are locked by
-- that UPDATE itself: no FOR UPDATE read of each one first (no row-lock WAL
-- record), and no per-member subtransaction.
--
-- Every member the statement did not release (an id with no permit: it is
-- retired; already released; another session's, another uid's, uncertain)
-- is answered by permit_release_as: it changes nothing in these cases, or
-- retires the id, so running it after the others gives what it would have
-- given in arrival order. Such members are the rare ones, and in a group of
-- several each runs in a subtransaction of its own, so an error of one
-- comes back in its own row.
--
-- A group that names one id twice keeps the member-by-member loop: the
-- second release of an id must see the first.
--
-- Generic plans, always: its statements take arrays, whose size a custom
-- plan sees and a generic one does not, so PL/pgSQL kept re-planning the
-- release statement on every call (planning cost as much as running it;
-- docs/PERFORMANCE.md). With sequential scans off every generic plan here
-- is a primary-key walk per member, on empty and on large tables alike.
-- Hash and merge joins are off too: a generic plan does not know how many
-- members a group has, and either join walks a whole index (every open
-- permit, every quota key) where a loop of primary-key lookups per member
-- is what a group of any size needs.
CREATE FUNCTION pgcoord.permit_release_group(p_uids bigint[], p_ids text[],
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
			state_at = now()
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
			p.quota_key, p.quota_weight),
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
		INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason,
			state, phase)
		SELECT s.id, s.key, -s.weight,
		       CASE WHEN s.override THEN 'override_released' ELSE 'released' END,
		       coalesce(s.actor, 'agent@' || coalesce(s.owner_replica, '?')), s.reason,
		       'released', s.phase
		FROM s ORDER BY s.i, s.key)
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

-- A lone release (a group of one, agent/permits.c): what the set-based part
-- of permit_release_group does for one member, in one frame with scalar
-- arguments, so every statement is a primary-key lookup whose plan PL/pgSQL
-- keeps, and the answer is one value, not a set. The same lock order (the
-- permit's quota rows in key order, then the permit row, locked by the
-- UPDATE that releases it), the same counters and audit rows; a permit the
-- UPDATE does not release (no permit: the id is retired; already released;
-- another session's or uid's, uncertain) is answered by permit_release_as,
-- whose refusals raise as the group's lone member's do.
CREATE FUNCTION pgcoord.permit_release_one(p_uid bigint, p_id text, p_session bigint,
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
			state_at = now()
		WHERE p.id = p_id AND p.released_at IS NULL
		  AND (p_override OR p.state = 'held')
		  AND (p_override OR (p.owner_session = p_session
		       AND (SELECT s.owner_uid FROM pgcoord.sessions s
			    WHERE s.id = p.owner_session) IS NOT DISTINCT FROM p_uid))
		RETURNING p.phase, p.owner_replica, p.quota_key, p.quota_weight),
	u AS (
		UPDATE pgcoord.quotas q SET in_flight = q.in_flight - r.quota_weight
		FROM r WHERE q.key = r.quota_key),
	e AS (
		INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason,
			state, phase)
		SELECT p_id, r.quota_key, -r.quota_weight,
		       CASE WHEN p_override THEN 'override_released' ELSE 'released' END,
		       coalesce(p_actor, 'agent@' || coalesce(r.owner_replica, '?')), p_reason,
		       'released', r.phase
		FROM r WHERE r.quota_key IS NOT NULL)
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
		INSERT INTO pgcoord.permit_events (permit_id, key, delta, event, actor, reason,
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

-- The audit actor for the janitor's work: the agent holding the janitor
-- lease ("pgcoord.janitor", agent/janitor.h) runs the sweeps that call this.
CREATE FUNCTION pgcoord.janitor_actor() RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT 'janitor@' || coalesce(
		(SELECT l.holder_replica FROM pgcoord.leases l
		 WHERE l.name = 'pgcoord.janitor' AND l.expires_at > now()), '?')
$$;

-- The consequences for permits of their owner sessions ending (guarantee
-- 5): on_owner_loss = 'release' permits (in-process work that died with its
-- owner) are released; the others become uncertain and keep counting. Safe
-- to apply twice: only permits still owned by those sessions and not yet
-- in their end state change. p_actor NULL: 'agent@<owner's replica>'.
-- Sequential scans off: the plans made on a fresh install's empty tables
-- read every permit, tombstones included, on each session end.
CREATE FUNCTION pgcoord.permits_owner_lost(p_sessions bigint[], p_reason text, p_actor text)
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_cand text[];
	v_release text[] := '{}';
	v_mark text[] := '{}';
	r record;
	v_n integer;
BEGIN
	SELECT coalesce(array_agg(p.id), '{}') INTO v_cand FROM pgcoord.permits p
	WHERE p.owner_session = ANY (p_sessions) AND p.state <> 'released';
	IF cardinality(v_cand) = 0 THEN
		RETURN 0;
	END IF;
	PERFORM pgcoord.permits_lock_quotas(ARRAY(
		SELECT p.id FROM pgcoord.permits p
		WHERE p.id = ANY (v_cand) AND p.on_owner_loss = 'release'));
	-- one pass over the permit rows, in id order, re-checked under the lock
	FOR r IN SELECT p.id, p.state, p.on_owner_loss FROM pgcoord.permits p
		 WHERE p.id = ANY (v_cand) AND p.owner_session = ANY (p_sessions)
		   AND p.state <> 'released'
		 ORDER BY p.id FOR UPDATE
	LOOP
		IF r.on_owner_loss = 'release' THEN
			v_release := v_release || r.id;
		ELSIF r.state = 'held' THEN
			v_mark := v_mark || r.id;
		END IF;
	END LOOP;
	v_n := pgcoord.permits_release_locked(v_release, 'owner_lost_released', p_actor,
		'owner lost: ' || p_reason);
	IF cardinality(v_mark) > 0 THEN
		WITH m AS (
			UPDATE pgcoord.permits p SET state = 'uncertain', state_at = now(),
				uncertain_reason = 'owner session ' || p.owner_session || ' ended: ' ||
					p_reason
			WHERE p.id = ANY (v_mark)
			RETURNING p.id, p.owner_replica, p.phase, p.uncertain_reason)
		INSERT INTO pgcoord.permit_events (permit_id, event, actor, reason, state, phase)
		SELECT m.id, 'uncertain', coalesce(p_actor, 'agent@' || coalesce(m.owner_replica, '?')),
		       m.uncertain_reason, 'uncertain', m.phase
		FROM m ORDER BY m.id;
	END IF;
	RETURN v_n;
END $$;

-- The janitor's permit duty, bounded by p_limit per pass:
-- 1. permits still held by a session that is no longer live get the
--    owner-loss treatment. The hook normally did that already; this catches
--    sessions that ended without it (agent_register closes a crashed
--    predecessor's lapsed sessions directly) and a claim that committed
--    while its session was being closed.
-- 2. the opt-in lapse policy: an uncertain permit is released once it has
--    been uncertain for longer than lapse_after_s of EVERY quota it holds —
--    one quota's policy never frees another quota's slot.
-- Returns how many permits were released (through the shared, audited
-- path, so a permit its owner released meanwhile is never decremented
-- twice). The liveness test of the safety net is NOT EXISTS over sessions,
-- planned as one anti-join, not a call of session_is_live per permit (a
-- SECURITY DEFINER function is never inlined). Sequential scans off: the
-- plan made on a fresh install read every permit on each sweep; this one
-- walks permits_open_by_owner, the open permits only.
CREATE FUNCTION pgcoord.janitor_lapse_permits(p_limit integer,
	p_actor text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_actor text := coalesce(p_actor, pgcoord.janitor_actor());
	v_sessions bigint[];
	v_cand text[];
	v_locked text[];
	v_n integer := 0;
BEGIN
	-- session_is_live, written out so the planner can join (see above)
	SELECT coalesce(array_agg(DISTINCT p.owner_session), '{}') INTO v_sessions
	FROM (SELECT p.owner_session FROM pgcoord.permits p
	      WHERE p.owner_session IS NOT NULL AND p.state <> 'released'
		AND (p.state = 'held' OR (p.state = 'uncertain' AND p.on_owner_loss = 'release'))
		AND NOT EXISTS (SELECT 1 FROM pgcoord.sessions s
				WHERE s.id = p.owner_session AND s.closed_at IS NULL
				  AND s.expires_at > now())
	      LIMIT p_limit) p;
	IF cardinality(v_sessions) > 0 THEN
		v_n := v_n + pgcoord.permits_owner_lost(v_sessions, 'found no longer live by the janitor',
			v_actor);
	END IF;

	SELECT coalesce(array_agg(c.id), '{}') INTO v_cand
	FROM (SELECT p.id FROM pgcoord.permits p
	      WHERE p.state = 'uncertain'
		AND NOT EXISTS (
			SELECT 1 FROM pgcoord.permit_quotas pq
			JOIN pgcoord.quotas q ON q.key = pq.key
			WHERE pq.permit_id = p.id
			  AND (q.lapse_after_s IS NULL
			       OR p.state_at + q.lapse_after_s * interval '1 second' > now()))
	      ORDER BY p.state_at LIMIT p_limit) c;
	IF cardinality(v_cand) = 0 THEN
		RETURN v_n;
	END IF;
	PERFORM pgcoord.permits_lock_quotas(v_cand);
	-- re-checked under the lock: a resolve may have adopted one meanwhile
	SELECT coalesce(array_agg(l.id), '{}') INTO v_locked
	FROM (SELECT p.id FROM pgcoord.permits p
	      WHERE p.id = ANY (v_cand) AND p.state = 'uncertain'
		AND NOT EXISTS (
			SELECT 1 FROM pgcoord.permit_quotas pq
			JOIN pgcoord.quotas q ON q.key = pq.key
			WHERE pq.permit_id = p.id
			  AND (q.lapse_after_s IS NULL
			       OR p.state_at + q.lapse_after_s * interval '1 second' > now()))
	      ORDER BY p.id FOR UPDATE OF p) l;
	v_n := v_n + pgcoord.permits_release_locked(v_locked, 'lapsed', v_actor,
		'uncertain for longer than lapse_after_s');
	RETURN v_n;
END $$;

SELECT pgcoord.secure_functions();
