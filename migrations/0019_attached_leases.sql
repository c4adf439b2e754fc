-- A held lease costs no write a beat: it lives with its agent's row.
--
-- Since 0017 a held lease is renewed inside its agent's heartbeat, but the
-- renewal still wrote the lease row every ttl/3, and the page of a fleet's
-- lease rows, packed full, was pruned at nearly every write: about 29 bytes
-- of WAL a second per held lease, a fifth of an idle agent's
-- (docs/CAPACITY.md). A lease is now renewed the way a session is since
-- 0015:
--
-- * attached (expires_at IS NULL): its expiry is its holder agent's last
--   beat plus its ttl, agents.heartbeat_at + ttl_ms, while that agent row
--   (holder_replica, holder_incarnation) has not stopped. Every beat of
--   the agent extends it; nothing is written.
-- * explicit (expires_at set): as every lease was before.
--
-- The table is pgcoord.lease_rows; pgcoord.leases is a view of it with the
-- effective expires_at (and renewed_at, the agent's last beat when
-- attached), the same columns as before, so every reader reads the one
-- rule. An insert into the view goes to the table.
--
-- Who attaches: a beat that carries a lease's renewal (agent_beat, 0017)
-- attaches a lease it may renew (the row names the beat's session and
-- epoch, unexpired, and the session is attached to this incarnation). Once
-- attached, a beat's renewal is a read that confirms exactly that; the
-- agent's belief is unchanged (send time of the confirming beat + ttl −
-- renew), and the row's expiry, the beat's now() + ttl, lies beyond it.
-- lease_acquire writes an explicit expiry, as before (an acquisition, or a
-- renewal of the agent's own statements).
--
-- A lease is pinned (given the explicit expiry it had) whenever what it
-- lives on stops being renewed, in the same transaction, so it is never
-- cut short and never revived: when its session stops being renewed by the
-- beat (pinned at the previous beat + ttl, the last one that renewed it),
-- when the beat finds its own row lapsed (the same), when its session
-- closes or is pinned any other way (the trigger lease_rows_pin_with_session:
-- the agent's last beat + ttl), and when its agent row is stopped or taken
-- over by a new incarnation (lease_rows_pin_with_agent: that row's last
-- beat + ttl).
--
-- Locks. The beat locks its agent row first (its update) and only then any
-- lease row (attaching, pinning). lease_acquire, which must judge an
-- attached lease's expiry against a beat that may be in flight, reads the
-- row unlocked to learn the holder, locks that holder's agent row FOR SHARE
-- (waiting for such a beat), then the lease row, and judges on what it then
-- reads: the same order.
--
-- The janitor's fold of the audit (0016) no longer writes its horizon row
-- on a sweep that has nothing to fold.
--
-- The upgrade renames the table and makes one column nullable: every lease
-- stays explicit until a beat of this version attaches it. An agent of the
-- previous version calls lease_acquire, agent_beat and agent_heartbeat as
-- before; they are these.

ALTER TABLE pgcoord.leases RENAME TO lease_rows;
ALTER TABLE pgcoord.lease_rows ALTER COLUMN expires_at DROP NOT NULL;

-- The holder agent's last beat, for an attached lease; NULL when the agent
-- row it lives on stopped or was replaced (every path that does so pins
-- the lease first; were one missed, the view below counts the lease lapsed
-- since it was attached).
CREATE FUNCTION pgcoord.lease_beat_at(p_replica text, p_incarnation bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
	SELECT a.heartbeat_at FROM pgcoord.agents a
	WHERE a.replica_id = p_replica AND a.incarnation = p_incarnation AND a.stopped_at IS NULL
$$;

-- Every lease with its effective expiry: the one rule (above).
CREATE VIEW pgcoord.leases AS
	SELECT l.name, l.holder_session, l.holder_replica, l.holder_incarnation, l.epoch, l.ttl_ms,
	       l.acquired_at,
	       CASE WHEN l.expires_at IS NULL
		    THEN coalesce((SELECT a.heartbeat_at FROM pgcoord.agents a
				   WHERE a.replica_id = l.holder_replica
				     AND a.incarnation = l.holder_incarnation
				     AND a.stopped_at IS NULL), l.renewed_at)
		    ELSE l.renewed_at END AS renewed_at,
	       coalesce(l.expires_at,
			(SELECT a.heartbeat_at + pgcoord.ms_interval(l.ttl_ms) FROM pgcoord.agents a
			 WHERE a.replica_id = l.holder_replica
			   AND a.incarnation = l.holder_incarnation AND a.stopped_at IS NULL),
			l.renewed_at) AS expires_at
	FROM pgcoord.lease_rows l;

-- A lease written to the view (tests, repairs) goes to the table.
CREATE FUNCTION pgcoord.leases_insert()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO pgcoord.lease_rows (name, holder_session, holder_replica,
		holder_incarnation, epoch, ttl_ms, acquired_at, renewed_at, expires_at)
	VALUES (NEW.name, NEW.holder_session, NEW.holder_replica, NEW.holder_incarnation,
		NEW.epoch, NEW.ttl_ms, NEW.acquired_at, NEW.renewed_at,
		coalesce(NEW.expires_at, now()));
	RETURN NEW;
END $$;

CREATE TRIGGER leases_insert INSTEAD OF INSERT ON pgcoord.leases
	FOR EACH ROW EXECUTE FUNCTION pgcoord.leases_insert();

-- A session that stops being attached (pinned, closed) pins the leases it
-- holds attached: at its agent's last beat + ttl, the latest expiry they
-- had (now + ttl when that row is gone: never shorter than they had).
CREATE FUNCTION pgcoord.lease_rows_pin_with_session()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE pgcoord.lease_rows l
	SET expires_at = coalesce(pgcoord.lease_beat_at(l.holder_replica, l.holder_incarnation),
				  now()) + pgcoord.ms_interval(l.ttl_ms)
	WHERE l.holder_session = NEW.id AND l.expires_at IS NULL;
	RETURN NULL;
END $$;

CREATE TRIGGER lease_rows_pin_with_session AFTER UPDATE OF expires_at, closed_at
	ON pgcoord.sessions FOR EACH ROW
	WHEN (OLD.expires_at IS NULL AND (NEW.expires_at IS NOT NULL OR NEW.closed_at IS NOT NULL))
	EXECUTE FUNCTION pgcoord.lease_rows_pin_with_session();

-- An agent row stopped or taken by a new incarnation pins the leases
-- attached to the old one, at that row's last beat + ttl.
CREATE FUNCTION pgcoord.lease_rows_pin_with_agent()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE pgcoord.lease_rows l
	SET expires_at = OLD.heartbeat_at + pgcoord.ms_interval(l.ttl_ms)
	WHERE l.holder_replica = OLD.replica_id AND l.holder_incarnation = OLD.incarnation
	  AND l.expires_at IS NULL;
	RETURN NULL;
END $$;

CREATE TRIGGER lease_rows_pin_with_agent AFTER UPDATE ON pgcoord.agents FOR EACH ROW
	WHEN (OLD.incarnation IS DISTINCT FROM NEW.incarnation
	      OR (OLD.stopped_at IS NULL AND NEW.stopped_at IS NOT NULL))
	EXECUTE FUNCTION pgcoord.lease_rows_pin_with_agent();

-- The beat, whole: 0017's agent_heartbeat inlined (a SECURITY DEFINER call
-- inside another set and restored the search path twice a beat), and the
-- leases lose their life with the sessions: a session the beat no longer
-- lists, or every attached one when the row had lapsed, pins its attached
-- leases at the previous beat + ttl (the last beat that renewed them),
-- before the sessions are pinned. A renewal attaches the lease (one write,
-- the first time) or confirms an attached one by a read. Either way: the
-- row names the beat's session at the epoch the agent believes, from this
-- replica, and the session is attached to this incarnation (so live: the
-- beat has just renewed the agent row). An explicit row must not have
-- lapsed.
CREATE OR REPLACE FUNCTION pgcoord.agent_beat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[], p_leases text[], p_lease_sessions bigint[],
	p_lease_epochs bigint[], p_lease_ttls bigint[], p_bound_ms integer)
RETURNS pgcoord.beat_result
LANGUAGE plpgsql AS $$
DECLARE
	v_n integer := coalesce(cardinality(p_leases), 0);
	v_renewed integer[] := '{}';
	v_i bigint;
	v_prev timestamptz;
	v_prev_beat timestamptz;
	v_attached bigint[];
	v_known bigint[];
	v_gone bigint[];
	v_back bigint[] := '{}';
	v_back_renewed bigint[];
BEGIN
	IF v_n <> coalesce(cardinality(p_lease_sessions), 0)
	   OR v_n <> coalesce(cardinality(p_lease_epochs), 0)
	   OR v_n <> coalesce(cardinality(p_lease_ttls), 0) THEN
		RAISE EXCEPTION 'the lease arrays of a beat differ in length' USING ERRCODE = 'PCINV';
	END IF;
	-- the beat's own server-side bound, which the agent sends with it
	-- instead of a set_config() statement before it (one statement a
	-- beat behind a pooler): every wait of a beat is a lock wait
	IF p_bound_ms IS NOT NULL THEN
		PERFORM set_config('lock_timeout', greatest(p_bound_ms, 1) || 'ms', true);
	END IF;
	-- o is read in the statement's snapshot: the row before this update
	UPDATE pgcoord.agents a SET heartbeat_at = now(),
		expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
	FROM (SELECT x.expires_at, x.heartbeat_at FROM pgcoord.agents x
	      WHERE x.replica_id = p_replica_id) o
	WHERE a.replica_id = p_replica_id AND a.incarnation = p_incarnation
	  AND a.stopped_at IS NULL
	RETURNING o.expires_at, o.heartbeat_at INTO v_prev, v_prev_beat;
	IF NOT FOUND THEN
		RETURN ROW(false, ARRAY(SELECT DISTINCT unnest(p_sessions)), pgcoord.ms(now()),
			ARRAY(SELECT false FROM generate_series(1, v_n)));
	END IF;
	-- the short way: the listed sessions are exactly the attached ones
	-- (a new statement: it sees what a janitor or recovery that held the
	-- row before us committed), and the row had not lapsed; else the long
	-- way, 0015's
	IF NOT (v_prev > now() AND (
		SELECT count(*) = cardinality(p_sessions)
		       AND coalesce(sum(hashint8extended(s.id, 0)), 0)
			   = (SELECT coalesce(sum(hashint8extended(x, 0)), 0)
			      FROM unnest(p_sessions) AS x)
		FROM pgcoord.sessions s
		WHERE s.replica_id = p_replica_id AND s.incarnation = p_incarnation
		  AND s.closed_at IS NULL AND s.expires_at IS NULL)) THEN
		-- v_known: the attached sessions opened before the previous
		-- beat, which the agent knew of when it listed this one; a
		-- younger one may have opened after the list was made, and is
		-- not taken for gone
		SELECT coalesce(array_agg(s.id), '{}'),
		       coalesce(array_agg(s.id) FILTER (WHERE s.opened_at < v_prev_beat), '{}')
		INTO v_attached, v_known
		FROM pgcoord.sessions s
		WHERE s.replica_id = p_replica_id AND s.incarnation = p_incarnation
		  AND s.closed_at IS NULL AND s.expires_at IS NULL;
		IF v_prev <= now() THEN
			v_gone := v_attached;
		ELSE
			v_gone := ARRAY(SELECT unnest(v_known) EXCEPT SELECT unnest(p_sessions));
		END IF;
		IF cardinality(v_gone) > 0 THEN
			UPDATE pgcoord.lease_rows l
			SET expires_at = v_prev_beat + pgcoord.ms_interval(l.ttl_ms)
			WHERE l.holder_session = ANY (v_gone) AND l.expires_at IS NULL;
			UPDATE pgcoord.sessions s SET expires_at = v_prev
			WHERE s.id = ANY (v_gone) AND s.closed_at IS NULL AND s.expires_at IS NULL;
			v_attached := ARRAY(SELECT unnest(v_attached) EXCEPT SELECT unnest(v_gone));
		END IF;
		v_back := ARRAY(SELECT unnest(p_sessions) EXCEPT SELECT unnest(v_attached));
		IF cardinality(v_back) > 0 THEN
			WITH r AS (
				UPDATE pgcoord.sessions s SET expires_at = NULL
				WHERE s.id = ANY (v_back) AND s.replica_id = p_replica_id
				  AND s.incarnation = p_incarnation AND s.closed_at IS NULL
				  AND s.expires_at IS NOT NULL
				  AND EXISTS (SELECT 1 FROM pgcoord.live_sessions lv WHERE lv.id = s.id)
				RETURNING s.id)
			SELECT coalesce(array_agg(id), '{}') INTO v_back_renewed FROM r;
			v_back := ARRAY(SELECT unnest(v_back) EXCEPT SELECT unnest(v_back_renewed));
		END IF;
	END IF;
	IF v_n > 0 THEN
		-- a new statement: it sees the sessions and leases as the beat
		-- left them
		FOR v_i IN
			SELECT t.i
			FROM unnest(p_leases, p_lease_sessions, p_lease_epochs, p_lease_ttls)
				WITH ORDINALITY AS t(name, session, epoch, ttl, i)
			JOIN pgcoord.lease_rows l ON l.name = t.name
			WHERE l.expires_at IS NULL AND l.holder_session = t.session
			  AND l.epoch = t.epoch AND l.holder_replica = p_replica_id
			  AND l.holder_incarnation = p_incarnation AND l.ttl_ms = t.ttl
			  AND EXISTS (SELECT 1 FROM pgcoord.sessions s
				      WHERE s.id = t.session AND s.replica_id = p_replica_id
					AND s.incarnation = p_incarnation AND s.closed_at IS NULL
					AND s.expires_at IS NULL)
		LOOP
			v_renewed := v_renewed || v_i::integer;
		END LOOP;
		IF cardinality(v_renewed) < v_n THEN
			FOR v_i IN
				UPDATE pgcoord.lease_rows l SET renewed_at = now(), ttl_ms = t.ttl,
					holder_incarnation = p_incarnation, expires_at = NULL
				FROM unnest(p_leases, p_lease_sessions, p_lease_epochs, p_lease_ttls)
					WITH ORDINALITY AS t(name, session, epoch, ttl, i)
				WHERE t.i <> ALL (v_renewed) AND l.name = t.name
				  AND l.expires_at IS NOT NULL AND l.expires_at > now()
				  AND l.holder_session = t.session AND l.epoch = t.epoch
				  AND l.holder_replica = p_replica_id
				  AND EXISTS (SELECT 1 FROM pgcoord.sessions s
					      WHERE s.id = t.session AND s.replica_id = p_replica_id
						AND s.incarnation = p_incarnation
						AND s.closed_at IS NULL AND s.expires_at IS NULL)
				RETURNING t.i
			LOOP
				v_renewed := v_renewed || v_i::integer;
			END LOOP;
		END IF;
	END IF;
	RETURN ROW(true, v_back, pgcoord.ms(now()),
		ARRAY(SELECT g = ANY (v_renewed) FROM generate_series(1, v_n) AS g ORDER BY g));
END $$;

-- The heartbeat of an agent of the version before 0017 (no leases, its
-- bound sent beside it): the beat above.
CREATE OR REPLACE FUNCTION pgcoord.agent_heartbeat(p_replica_id text, p_incarnation bigint,
	p_ttl_ms bigint, p_sessions bigint[])
RETURNS pgcoord.heartbeat_result
LANGUAGE sql AS $$
	SELECT b.agent_ok, b.lost, b.now_ms
	FROM pgcoord.agent_beat(p_replica_id, p_incarnation, p_ttl_ms, p_sessions, '{}', '{}',
		'{}', '{}', NULL) b
$$;

-- As in 0017, on the effective expiry: the read of a lost campaign through
-- the view; the locked path locks the holder's agent row first when the
-- lease is attached (above), then the row, and judges what it then reads.
-- An acquisition or a renewal by statement leaves the row explicit.
CREATE OR REPLACE FUNCTION pgcoord.lease_acquire(p_name text, p_session bigint, p_replica text,
	p_incarnation bigint, p_ttl_ms bigint)
RETURNS pgcoord.lease_decision
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.lease_decision;
	v_epoch bigint;
	v_prev_epoch bigint;
	v_prev_session bigint;
	v_prev_expires timestamptz;
	v_row pgcoord.lease_rows;
	v_locked text;
BEGIN
	-- held by another session and not expired: a lost campaign, answered
	-- without a lock or a write
	SELECT false, l.epoch, l.holder_session, l.holder_replica,
	       greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
	INTO v_result.leader, v_result.epoch, v_result.holder_session, v_result.holder_replica,
	     v_result.expires_in_ms
	FROM pgcoord.leases l
	WHERE l.name = p_name AND l.holder_session IS NOT NULL
	  AND l.holder_session IS DISTINCT FROM p_session AND l.expires_at > now();
	IF FOUND THEN
		RETURN v_result;
	END IF;
	IF pgcoord.session_lock_live(p_session) THEN
		-- an attached row lives on its agent's row: a beat of that agent in
		-- flight commits before we judge (the beat's lock order: the agent
		-- row, then lease rows)
		SELECT * INTO v_row FROM pgcoord.lease_rows l WHERE l.name = p_name;
		IF FOUND AND v_row.expires_at IS NULL THEN
			PERFORM 1 FROM pgcoord.agents a
			WHERE a.replica_id = v_row.holder_replica FOR SHARE;
			v_locked := v_row.holder_replica;
		END IF;
		-- lock first, so the previous holder we record is the one we replace
		PERFORM 1 FROM pgcoord.lease_rows l WHERE l.name = p_name FOR UPDATE;
		SELECT * INTO v_row FROM pgcoord.lease_rows l WHERE l.name = p_name;
		IF FOUND AND v_row.expires_at IS NULL
		   AND v_row.holder_replica IS DISTINCT FROM v_locked THEN
			-- attached meanwhile (a beat committed while we waited): its
			-- agent's row too, out of the order above, as rarely as that
			PERFORM 1 FROM pgcoord.agents a
			WHERE a.replica_id = v_row.holder_replica FOR SHARE;
		END IF;
		SELECT l.epoch, l.holder_session, l.expires_at
		INTO v_prev_epoch, v_prev_session, v_prev_expires
		FROM pgcoord.leases l WHERE l.name = p_name;
		-- held by someone else: answer without drawing a token, so
		-- campaigns do not burn through the sequence
		IF NOT (FOUND AND v_prev_session IS DISTINCT FROM p_session
			AND v_prev_session IS NOT NULL AND v_prev_expires > now()) THEN
			INSERT INTO pgcoord.lease_rows AS l (name, holder_session, holder_replica,
				holder_incarnation, epoch, ttl_ms, acquired_at, renewed_at,
				expires_at)
			VALUES (p_name, p_session, p_replica, p_incarnation,
				nextval('pgcoord.token_seq'), p_ttl_ms, now(), now(),
				now() + pgcoord.ms_interval(p_ttl_ms))
			ON CONFLICT (name) DO UPDATE
			SET epoch = CASE WHEN l.holder_session = p_session AND v_prev_expires > now()
					 THEN l.epoch ELSE nextval('pgcoord.token_seq') END,
			    acquired_at = CASE WHEN l.holder_session = p_session
						    AND v_prev_expires > now()
					       THEN l.acquired_at ELSE now() END,
			    holder_session = p_session, holder_replica = p_replica,
			    holder_incarnation = p_incarnation, ttl_ms = p_ttl_ms,
			    renewed_at = now(), expires_at = now() + pgcoord.ms_interval(p_ttl_ms)
			WHERE l.holder_session = p_session OR l.holder_session IS NULL
			   OR v_prev_expires <= now()
			RETURNING l.epoch INTO v_epoch;
		END IF;
	END IF;

	IF v_epoch IS NULL THEN
		-- not the leader: the lease as it stands (no row: nobody ever held it)
		v_result.leader := false;
		SELECT l.epoch, l.holder_session, l.holder_replica,
		       greatest(pgcoord.ms(l.expires_at) - pgcoord.ms(now()), 0)
		INTO v_result.epoch, v_result.holder_session, v_result.holder_replica,
		     v_result.expires_in_ms
		FROM pgcoord.leases l WHERE l.name = p_name;
		RETURN v_result;
	END IF;
	IF v_prev_epoch IS DISTINCT FROM v_epoch THEN
		IF v_prev_session IS NOT NULL AND v_prev_session <> p_session THEN
			INSERT INTO pgcoord.lease_events (name, epoch, session, event, reason)
			VALUES (p_name, v_prev_epoch, v_prev_session, 'expired',
				'taken over after the lease lapsed');
		END IF;
		INSERT INTO pgcoord.lease_events (name, epoch, session, replica_id, event)
		VALUES (p_name, v_epoch, p_session, p_replica, 'acquired');
	END IF;
	v_result := ROW(true, v_epoch, p_session, p_replica, p_ttl_ms);
	RETURN v_result;
END $$;

-- As in 0003, on the table: a hand-back makes the row explicit and
-- expired.
CREATE OR REPLACE FUNCTION pgcoord.lease_release(p_name text, p_session bigint, p_reason text)
RETURNS pgcoord.lease_hand_back
LANGUAGE plpgsql AS $$
DECLARE
	v_result pgcoord.lease_hand_back;
	v_epoch bigint;
BEGIN
	SELECT l.epoch INTO v_epoch FROM pgcoord.lease_rows l
	WHERE l.name = p_name AND l.holder_session = p_session FOR UPDATE;
	v_result.released := FOUND;
	IF v_result.released THEN
		UPDATE pgcoord.lease_rows
		SET holder_session = NULL, holder_replica = NULL, holder_incarnation = NULL,
		    expires_at = now()
		WHERE name = p_name;
		INSERT INTO pgcoord.lease_events (name, epoch, session, event, reason)
		VALUES (p_name, v_epoch, p_session, 'released', p_reason);
	END IF;
	RETURN v_result;
END $$;

-- As in 0016, but an idle sweep (nothing to summarize, nothing to fold,
-- no new audit row since the last candidate) reads the horizon row and
-- writes nothing: it locked and rewrote that row every janitor sweep, a
-- lock record, an update and a commit a second for the fleet.
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
	-- nothing to do, read without a lock: no block range to summarize, the
	-- candidate folded, and the audit's sequence where it was when it was
	-- taken (a new candidate would be the same one): no lock, no write
	SELECT * INTO v_h FROM pgcoord.permit_audit_horizon h WHERE h.one;
	IF v_h.pending_upto IS NOT NULL AND v_h.folded_upto >= v_h.pending_upto
	   AND coalesce(pg_sequence_last_value('pgcoord.permit_events_id_seq'), 0)
		= v_h.pending_upto
	   AND v_h.summarized_below >= greatest(pg_relation_size('pgcoord.permit_events_log')
			/ current_setting('block_size')::bigint - 1, 0) / 8 * 8 THEN
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
