-- Agents, their incarnations, and client sessions.
--
-- Liveness is judged by the database clock only: a session is live while it
-- is not closed and its expires_at lies ahead of now(). Agents renew their
-- own row and all their sessions in one statement per heartbeat
-- (agent_heartbeat), so the cost of liveness is per host, not per session.

-- One fleet-wide sequence for fencing numbers: lease epochs, permit tokens,
-- record tokens. Strictly increasing across every agent.
CREATE SEQUENCE pgcoord.token_seq;

-- Database time as integer milliseconds since the epoch, the unit the wire
-- protocol uses for every *_at field.
CREATE FUNCTION pgcoord.ms(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT (extract(epoch FROM ts) * 1000)::bigint $$;

CREATE FUNCTION pgcoord.ms_interval(ms bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT ms * interval '1 millisecond' $$;

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
	internal     boolean NOT NULL DEFAULT false
);
CREATE INDEX sessions_open_by_agent ON pgcoord.sessions (replica_id, incarnation)
	WHERE closed_at IS NULL;

-- Registers an incarnation. Succeeds when the replica_id is free, stopped,
-- lapsed, already ours, or held by p_takeover (an incarnation the caller
-- proved dead: same host, its pid gone). Fails otherwise and names the
-- holder, so the newcomer can refuse to start with a useful message.
CREATE FUNCTION pgcoord.agent_register(p_replica_id text, p_incarnation bigint, p_host text,
	p_pid integer, p_version text, p_ttl_ms bigint, p_takeover bigint)
RETURNS TABLE (ok boolean, holder_host text, holder_pid integer,
	holder_incarnation bigint, holder_expires_in_ms bigint, taken_over bigint[])
LANGUAGE plpgsql AS $$
DECLARE
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
		RETURN QUERY SELECT false, a.host, a.pid, a.incarnation,
			pgcoord.ms(a.expires_at) - pgcoord.ms(now()), NULL::bigint[]
		FROM pgcoord.agents a WHERE a.replica_id = p_replica_id;
		RETURN;
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
		PERFORM pgcoord.on_sessions_ended(v_dead, 'its agent was replaced');
	END IF;
	RETURN QUERY SELECT true, p_host, p_pid, p_incarnation, p_ttl_ms, v_taken;
END $$;

-- The heartbeat: renews the agent row and every listed session in one
-- statement. A session that already lapsed is never revived — another
-- replica may have acted on its death — so it is reported lost instead.
CREATE FUNCTION pgcoord.agent_heartbeat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[])
RETURNS TABLE (agent_ok boolean, lost bigint[], now_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
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
	RETURN QUERY SELECT v_ok,
		ARRAY(SELECT x FROM unnest(p_sessions) AS x WHERE NOT (x = ANY (v_renewed))),
		pgcoord.ms(now());
END $$;

-- Opens a session for a current incarnation; no row when the incarnation
-- was superseded.
CREATE FUNCTION pgcoord.session_open(p_replica_id text, p_incarnation bigint, p_name text,
	p_ttl_ms bigint, p_internal boolean DEFAULT false)
RETURNS TABLE (session_id bigint)
LANGUAGE sql AS $$
	INSERT INTO pgcoord.sessions (replica_id, incarnation, name, expires_at, internal)
	SELECT p_replica_id, p_incarnation, p_name, now() + pgcoord.ms_interval(p_ttl_ms),
	       p_internal
	WHERE EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING id
$$;

-- Re-attaches a session that is still live and belongs to this replica_id.
CREATE FUNCTION pgcoord.session_resume(p_id bigint, p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint)
RETURNS TABLE (session_id bigint, name text)
LANGUAGE sql AS $$
	UPDATE pgcoord.sessions s
	SET incarnation = p_incarnation, expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	WHERE s.id = p_id AND s.replica_id = p_replica_id AND NOT s.internal
	  AND s.closed_at IS NULL AND s.expires_at > now()
	  AND EXISTS (SELECT 1 FROM pgcoord.agents a
		      WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
			AND a.stopped_at IS NULL)
	RETURNING s.id, s.name
$$;

CREATE FUNCTION pgcoord.session_close(p_ids bigint[], p_incarnation bigint, p_reason text)
RETURNS TABLE (session_id bigint)
LANGUAGE sql AS $$
	UPDATE pgcoord.sessions s SET closed_at = now(), close_reason = p_reason
	WHERE s.id = ANY (p_ids) AND s.incarnation = p_incarnation AND s.closed_at IS NULL
	RETURNING s.id
$$;

-- Clean shutdown: every session of this incarnation closes and the
-- replica_id is free for a successor at once.
CREATE FUNCTION pgcoord.agent_stop(p_replica_id text, p_incarnation bigint)
RETURNS TABLE (closed_sessions bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_n bigint;
BEGIN
	UPDATE pgcoord.sessions SET closed_at = now(), close_reason = 'agent stopped'
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation AND closed_at IS NULL;
	GET DIAGNOSTICS v_n = ROW_COUNT;
	UPDATE pgcoord.agents SET stopped_at = now()
	WHERE replica_id = p_replica_id AND incarnation = p_incarnation;
	RETURN QUERY SELECT v_n;
END $$;

CREATE VIEW pgcoord.live_sessions AS
	SELECT s.* FROM pgcoord.sessions s
	WHERE s.closed_at IS NULL AND s.expires_at > now();
