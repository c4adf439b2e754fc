-- Schema basics, agents and client sessions.
--
-- Liveness is judged by the database clock only: a session is live while it
-- is not closed and its expires_at lies ahead of now(). Agents renew their
-- own row and all their sessions in one statement per heartbeat
-- (agent_heartbeat), so the cost of liveness is per host, not per session.
--
-- Every session carries the uid of the client that opened it (SO_PEERCRED,
-- taken by the agent from the connection; no parameter names it). The uid
-- is the principal: a session is resumed only by its uid (or an admin), and
-- what a session owns (permits, retirements, records) answers to its uid,
-- also after the session died, so a restarted replica running as the same
-- user can take its work back.
--
-- Every pgcoord function is SECURITY DEFINER with a pinned search_path (see
-- the security migration), so Postgres never inlines a LANGUAGE sql one: it
-- would parse and plan its body again for every statement that calls it.
-- The small helpers the hot path calls are therefore PL/pgSQL, which keeps
-- its plans for the life of the connection.

-- One fleet-wide sequence for fencing numbers: lease epochs, permit tokens,
-- record tokens. Strictly increasing across every agent.
CREATE SEQUENCE pgcoord.token_seq;

-- Database time as integer milliseconds since the epoch, the unit the wire
-- protocol uses for every *_at field.
CREATE FUNCTION pgcoord.ms(ts timestamptz) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	RETURN (extract(epoch FROM ts) * 1000)::bigint;
END $$;

CREATE FUNCTION pgcoord.ms_interval(ms bigint) RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	RETURN ms * interval '1 millisecond';
END $$;

-- An instant as UTC ISO 8601 with milliseconds, for messages people read.
CREATE FUNCTION pgcoord.iso_ms(ts timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

-- One row per replica_id, holding its current incarnation. A replica_id can
-- be taken only when the holder stopped or its heartbeat lapsed (guarantee 9).
CREATE TABLE pgcoord.agents (
	replica_id   text PRIMARY KEY CHECK (length(replica_id) BETWEEN 1 AND 200),
	incarnation  bigint NOT NULL,
	host         text NOT NULL,
	pid          integer NOT NULL,
	version      text NOT NULL,
	started_at   timestamptz NOT NULL DEFAULT now(),
	heartbeat_at timestamptz NOT NULL DEFAULT now(),
	expires_at   timestamptz NOT NULL,
	stopped_at   timestamptz
);

CREATE TABLE pgcoord.sessions (
	id           bigserial PRIMARY KEY,
	replica_id   text NOT NULL,
	-- the incarnation that renews the session now; moves to a successor
	-- incarnation that takes over a crashed predecessor's live sessions
	incarnation  bigint NOT NULL,
	name         text NOT NULL DEFAULT '',
	opened_at    timestamptz NOT NULL DEFAULT now(),
	expires_at   timestamptz NOT NULL,
	closed_at    timestamptz,
	close_reason text,
	-- the agent's own session (its janitor candidacy), never a client's
	internal     boolean NOT NULL DEFAULT false,
	-- the uid of the client that opened it; never changes
	owner_uid    bigint
);

CREATE INDEX sessions_open_by_agent ON pgcoord.sessions (replica_id, incarnation)
	WHERE closed_at IS NULL;

-- The janitor's sweep, once a second, costs what is open, not the past,
-- and little per open row.
--
-- 1. Session expiry reads open sessions only.
--
-- Session rows stay after they close (nothing deletes them), so the table
-- grows with every session a fleet ever opened. janitor_expire_sessions
-- looks for open sessions past their expiry in id order; once PL/pgSQL
-- settles on its generic plan (from the sixth call of a backend on), that
-- plan walked the primary key through every row, closed ones included: a
-- sweep a second whose cost grew with the fleet's whole past (50,202 rows
-- read for 201 open sessions after 50,000 closed ones; janitor-scan).
--
-- This index holds the open sessions in id order, so the same statement
-- reads only them. Its column (id) and its predicate (closed_at) are never
-- changed by the heartbeat, which renews expires_at alone: the heartbeat's
-- updates stay HOT and the index costs liveness nothing.
CREATE INDEX sessions_open_by_id ON pgcoord.sessions (id) WHERE closed_at IS NULL;

-- How a session ended, for what follows from it (on_sessions_ended):
-- 'ended'  its client or its agent ended it (close, grace, stop, replaced);
-- 'lapsed' its expiry passed with nobody renewing it: its agent stopped
--          heartbeating (crashed, frozen, cut off), so nobody told its client.
-- The reason text beside it is for the audit only; no decision reads it.
CREATE TYPE pgcoord.session_end AS ENUM ('ended', 'lapsed');

CREATE VIEW pgcoord.live_sessions AS
	SELECT s.* FROM pgcoord.sessions s
	WHERE s.closed_at IS NULL AND s.expires_at > now();

-- What agent_register answers. ok = false is not a refusal: it names the
-- incarnation that holds the replica_id, which the agent logs, and when that
-- holder is dead on this host, takes over.
CREATE TYPE pgcoord.agent_claim_result AS (ok boolean, holder_host text, holder_pid integer,
	holder_incarnation bigint, holder_expires_in_ms bigint, taken_over bigint[]);

-- Registers an incarnation. Succeeds when the replica_id is free, stopped,
-- lapsed, already ours, or held by p_takeover (an incarnation the caller
-- proved dead: same host, its pid gone). Fails otherwise and names the
-- holder, so the newcomer can refuse to start with a useful message.
CREATE FUNCTION pgcoord.agent_register(p_replica_id text, p_incarnation bigint, p_host text,
	p_pid integer, p_version text, p_ttl_ms bigint, p_takeover bigint)
RETURNS pgcoord.agent_claim_result
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.agent_claim_result;
	v_taken bigint[];
	v_dead bigint[];
BEGIN
	INSERT INTO pgcoord.agents AS a (replica_id, incarnation, host, pid, version, expires_at)
	VALUES (p_replica_id, p_incarnation, p_host, p_pid, p_version,
		now() + pgcoord.ms_interval(p_ttl_ms))
	ON CONFLICT (replica_id) DO UPDATE
	SET incarnation = EXCLUDED.incarnation, host = EXCLUDED.host, pid = EXCLUDED.pid,
	    version = EXCLUDED.version, started_at = now(), heartbeat_at = now(),
	    expires_at = EXCLUDED.expires_at, stopped_at = NULL
	WHERE a.stopped_at IS NOT NULL OR a.expires_at <= now()
	   OR a.incarnation = EXCLUDED.incarnation OR a.incarnation = p_takeover;
	IF NOT FOUND THEN
		v_result.ok := false;
		SELECT a.host, a.pid, a.incarnation, pgcoord.ms(a.expires_at) - pgcoord.ms(now())
		INTO v_result.holder_host, v_result.holder_pid, v_result.holder_incarnation,
		     v_result.holder_expires_in_ms
		FROM pgcoord.agents a WHERE a.replica_id = p_replica_id;
		RETURN v_result;
	END IF;
	-- A predecessor's client sessions that are still live move to this
	-- incarnation, which keeps them for their resume grace. Lapsed ones
	-- are left to the janitor, which closes them through the session-end
	-- hook like every other expired session.
	WITH moved AS (
		UPDATE pgcoord.sessions s SET incarnation = p_incarnation
		WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
		  AND s.closed_at IS NULL AND s.expires_at > now() AND NOT s.internal
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_taken FROM moved;
	-- The predecessor's own session died with it (nobody can resume it):
	-- close it now so its janitor lease is handed back at once. Locked FOR
	-- UPDATE first, like every close (see session_lock_live).
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
	  AND s.closed_at IS NULL AND s.internal
	ORDER BY s.id FOR UPDATE;
	WITH dead AS (
		UPDATE pgcoord.sessions s SET closed_at = now(),
			close_reason = 'its agent was replaced by a new incarnation'
		WHERE s.replica_id = p_replica_id AND s.incarnation <> p_incarnation
		  AND s.closed_at IS NULL AND s.internal
		RETURNING s.id)
	SELECT coalesce(array_agg(id), '{}') INTO v_dead FROM dead;
	IF cardinality(v_dead) > 0 THEN
		-- defined by a later migration; PL/pgSQL resolves it at run time
		PERFORM pgcoord.on_sessions_ended(v_dead, 'its agent was replaced', 'ended');
	END IF;
	v_result := ROW(true, p_host, p_pid, p_incarnation, p_ttl_ms, v_taken);
	RETURN v_result;
END $$;

-- The heartbeat: renews the agent row and every listed session in one
-- statement. A session that already lapsed is never revived — another
-- replica may have acted on its death — so it is reported lost instead.
-- The sessions it could not renew are a set difference (hashed), O(n) in
-- the sessions of the agent, not a test of each against every renewed one.
CREATE TYPE pgcoord.heartbeat_result AS (agent_ok boolean, lost bigint[], now_ms bigint);

CREATE FUNCTION pgcoord.agent_heartbeat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[])
RETURNS pgcoord.heartbeat_result
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.heartbeat_result;
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
	v_result := ROW(v_ok,
		ARRAY(SELECT unnest(p_sessions) EXCEPT SELECT unnest(v_renewed)),
		pgcoord.ms(now()));
	RETURN v_result;
END $$;

-- Opens a session owned by p_owner_uid for a current incarnation. A
-- superseded incarnation is refused (PCSUP) before anything is written.
CREATE FUNCTION pgcoord.session_open(p_replica_id text, p_incarnation bigint, p_name text,
	p_ttl_ms bigint, p_internal boolean, p_owner_uid bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	v_id bigint;
BEGIN
	INSERT INTO pgcoord.sessions (replica_id, incarnation, name, expires_at, internal,
		owner_uid)
	SELECT p_replica_id, p_incarnation, p_name, now() + pgcoord.ms_interval(p_ttl_ms),
	       p_internal, p_owner_uid
	WHERE EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING id INTO v_id;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'incarnation % of agent % is no longer current; it is stopping',
			p_incarnation, p_replica_id
		USING ERRCODE = 'PCSUP';
	END IF;
	RETURN v_id;
END $$;

-- What session_resume answers: the session as it was re-attached.
CREATE TYPE pgcoord.session_resumption AS (session_id bigint, name text, owner_uid bigint);

-- Re-attaches a live session of this replica_id, for a current incarnation,
-- for its own uid or for an admin (p_admin). Refused, with nothing
-- written, when it is not resumable here (PCSEX) or belongs to another uid
-- (PCFBD).
CREATE FUNCTION pgcoord.session_resume(p_id bigint, p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_uid bigint, p_admin boolean)
RETURNS pgcoord.session_resumption
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.session_resumption;
	v_owner bigint;
BEGIN
	SELECT s.owner_uid INTO v_owner FROM pgcoord.sessions s
	WHERE s.id = p_id AND s.replica_id = p_replica_id AND NOT s.internal
	  AND s.closed_at IS NULL AND s.expires_at > now();
	-- owner_uid never changes, so this check cannot go stale
	IF FOUND AND NOT p_admin AND v_owner IS DISTINCT FROM p_uid THEN
		RAISE EXCEPTION 'session % belongs to %; resuming another uid''s session needs '
			'admin', p_id, coalesce('uid ' || v_owner, 'no recorded uid')
		USING ERRCODE = 'PCFBD';
	END IF;
	UPDATE pgcoord.sessions s
	SET incarnation = p_incarnation, expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	WHERE s.id = p_id AND s.replica_id = p_replica_id AND NOT s.internal
	  AND s.closed_at IS NULL AND s.expires_at > now()
	  AND EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING s.id, s.name, s.owner_uid INTO v_result;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'session % is no longer live; open a new one', p_id
		USING ERRCODE = 'PCSEX';
	END IF;
	RETURN v_result;
END $$;

CREATE FUNCTION pgcoord.session_owner_uid(p_session bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
	RETURN (SELECT s.owner_uid FROM pgcoord.sessions s WHERE s.id = p_session);
END $$;

CREATE FUNCTION pgcoord.session_is_live(p_session bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
	RETURN EXISTS (SELECT 1 FROM pgcoord.sessions s
		       WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now());
END $$;

-- Liveness for a write on behalf of p_session: the row is read under FOR
-- KEY SHARE, and every path that ends a session locks its row FOR UPDATE
-- first, so a concurrent close (agent stop, session.close, grace end,
-- expiry, recovery) either commits first and is seen here, or waits until
-- this transaction committed and then applies its consequences to what it
-- wrote. Without the lock a close could slip between the check and the
-- write, leaving a lease, permit or record taken by a session already
-- closed. KEY SHARE and not SHARE: the heartbeat's renewal (a plain UPDATE
-- of expires_at, which only ever extends liveness) must not wait for a
-- write that is itself waiting, say a claim queued on a quota row someone
-- holds; with SHARE, one such claim stalled the agent's heartbeat until
-- every session of the agent was declared lost. Session rows are always
-- locked before lease, quota, permit or record rows.
CREATE FUNCTION pgcoord.session_lock_live(p_session bigint) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
	PERFORM 1 FROM pgcoord.sessions s
	WHERE s.id = p_session AND s.closed_at IS NULL AND s.expires_at > now()
	FOR KEY SHARE;
	RETURN FOUND;
END $$;

SELECT pgcoord.secure_functions();
