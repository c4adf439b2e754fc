-- Retention: finished history leaves after a horizon (the agent's
-- retention_s; 0, the default, keeps everything).
--
-- Without it every permit ever claimed stays as a tombstone, every settled
-- record and every audit row stays, and the tables grow with the fleet's
-- whole past. The elected janitor calls these functions each sweep, each
-- deleting at most p_limit rows in one short transaction, oldest first.
-- They touch only what can no longer change or count: released permits,
-- settled records, and audit rows of those and of lease changes. A quota's
-- limit_set rows stay (a quota lives on), and so do sessions.
--
-- The price is the idempotency window: a duplicate of a claim (or a put of
-- a record) arriving after its tombstone was purged is new work. The
-- horizon must lie far beyond any retry a client may still make; the agent
-- refuses one shorter than an hour.

CREATE INDEX permits_released_at ON pgcoord.permits (released_at)
	WHERE state = 'released';

CREATE INDEX records_settled_at ON pgcoord.records (settled_at) WHERE terminal;

CREATE INDEX lease_events_at ON pgcoord.lease_events (at);

-- Released permits released before the horizon, with their quota shares and
-- their audit rows, unless a record still names them (it goes first, below).
-- A released permit's audit deltas sum to zero on each of its quotas, so
-- every in_flight still equals the sum of its audit deltas (guarantee 2).
-- SKIP LOCKED: a permit some call holds right now is left for a later sweep.
-- Deleting an admission already folded into permit_audit_totals together
-- with a release not yet folded would break the totals, so a permit is
-- purged only once all of its audit rows are folded.
-- Sequential scans off: planned on a fresh install, the audit probe read
-- the whole audit trail for every candidate; permit_events_by_permit
-- answers it by permit.
CREATE FUNCTION pgcoord.janitor_purge_permits(p_limit integer, p_keep_s integer)
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
		AND NOT EXISTS (SELECT 1 FROM pgcoord.permit_events e
				WHERE e.permit_id = p.id AND e.id > v_upto)
	      ORDER BY p.released_at
	      LIMIT p_limit
	      FOR UPDATE OF p SKIP LOCKED) d;
	IF cardinality(v_ids) = 0 THEN
		RETURN 0;
	END IF;
	DELETE FROM pgcoord.permit_events e WHERE e.permit_id = ANY (v_ids);
	DELETE FROM pgcoord.permit_quotas_multi pq WHERE pq.permit_id = ANY (v_ids);
	DELETE FROM pgcoord.permits p WHERE p.id = ANY (v_ids);
	RETURN cardinality(v_ids);
END $$;

-- Records settled before the horizon, with their audit rows.
-- PL/pgSQL, so the janitor's connection plans this once, not every sweep;
-- sequential scans off, since planned on a fresh install's empty tables
-- both deletes read every row (a hash join) instead of probing by key.
CREATE FUNCTION pgcoord.janitor_purge_records(p_limit integer, p_keep_s integer)
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_n integer;
BEGIN
	WITH doomed AS (
		SELECT r.kind, r.key FROM pgcoord.records r
		WHERE r.terminal AND r.settled_at < now() - make_interval(secs => p_keep_s)
		ORDER BY r.settled_at
		LIMIT p_limit
		FOR UPDATE OF r SKIP LOCKED),
	events AS (
		DELETE FROM pgcoord.record_events e USING doomed d
		WHERE e.kind = d.kind AND e.key = d.key),
	gone AS (
		DELETE FROM pgcoord.records r USING doomed d
		WHERE r.kind = d.kind AND r.key = d.key
		RETURNING 1)
	SELECT count(*)::integer INTO v_n FROM gone;
	RETURN v_n;
END $$;

-- Lease changes recorded before the horizon (a lease's row is its state;
-- these are history only). PL/pgSQL and sequential scans off, as above:
-- planned on an empty table, the delete read the whole table to find the
-- chosen ids. Oldest by time, not by id: lease_events_at then reads only
-- the rows past the horizon, where walking the ids read every row of the
-- retention window each sweep to find none.
CREATE FUNCTION pgcoord.janitor_purge_lease_events(p_limit integer, p_keep_s integer)
RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
	v_n integer;
BEGIN
	WITH gone AS (
		DELETE FROM pgcoord.lease_events e
		WHERE e.id IN (SELECT x.id FROM pgcoord.lease_events x
			       WHERE x.at < now() - make_interval(secs => p_keep_s)
			       ORDER BY x.at
			       LIMIT p_limit)
		RETURNING 1)
	SELECT count(*)::integer INTO v_n FROM gone;
	RETURN v_n;
END $$;

SELECT pgcoord.secure_functions();
