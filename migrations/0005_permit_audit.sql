-- permit.check costs what is open, not the past.
--
-- permits_check() reads the quotas, the permits that are not released
-- (through the partial index permits_open_by_owner), per-quota audit totals
-- folded by the janitor, and the audit rows after the fold. No audit row is
-- deleted by folding, so permit.history sees the whole trail.
--
-- Folding is safe only behind a horizon no transaction can still write
-- before. An audit row's id comes from a sequence when it is inserted, and
-- its transaction may commit later, so "the highest id visible now" is not
-- such a horizon. Every row that moves a counter is written by a
-- transaction that has already locked or updated its quota row, so it has
-- a transaction id before it draws its audit id. Each fold therefore
-- records a candidate: S, the sequence's last value, and then X, the next
-- transaction id not yet assigned (read after S). Any row with an id up to
-- S belongs to a transaction whose id is below X. Once every transaction
-- below X has ended (the oldest running one is X or later), every row up to
-- S is committed or gone for good, and a later sweep folds up to S. No
-- lock on any quota row is taken: claims never wait for a fold.
--
-- The rows past folded_upto are found through the BRIN index
-- permit_events_by_id (0004). The fold summarizes its ranges as the table
-- grows, all but the last one: an unsummarized range is read by every scan,
-- and every insert into a summarized range past its maximum rewrites its
-- summary. A row committed late into a range already summarized widens that
-- summary as it is inserted, so the argument above holds: the index hands a
-- scan every block that may hold a matching row, visible or not yet.

-- One row: audit ids up to folded_upto are in the totals below; the
-- candidate (pending_upto, pending_xmax) becomes safe later.
CREATE TABLE pgcoord.permit_audit_horizon (
	one          boolean PRIMARY KEY DEFAULT true CHECK (one),
	folded_upto  bigint NOT NULL DEFAULT 0,
	pending_upto bigint,
	pending_xmax xid8,
	folded_at    timestamptz,
	-- blocks of permit_events below this are in BRIN ranges summarized
	summarized_below bigint NOT NULL DEFAULT 0
);

INSERT INTO pgcoord.permit_audit_horizon DEFAULT VALUES;

-- Per quota, over its audit rows with id <= folded_upto: the sum of the
-- deltas, the last admission (a positive delta) and the last limit_set.
CREATE TABLE pgcoord.permit_audit_totals (
	key        text COLLATE "C" PRIMARY KEY,
	delta_sum  bigint NOT NULL,
	last_admit bigint,
	last_set   bigint
);

-- Summarizes at most p_limit BRIN ranges of permit_events_by_id, oldest
-- first, all but the one holding the table's last block; returns the block
-- below which every range is now summarized. The ranges' size is the
-- index's pages_per_range (0004). It skips a turn rather than wait while
-- VACUUM holds the table (VACUUM summarizes too).
CREATE FUNCTION pgcoord.permit_events_summarize(p_from bigint, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	c_range constant bigint := 8;
	v_blocks bigint := pg_relation_size('pgcoord.permit_events')
		/ current_setting('block_size')::bigint;
	v_last bigint := greatest(v_blocks - 1, 0) / c_range * c_range;
	v_from bigint := least(p_from, v_last);
	v_n integer := 0;
BEGIN
	IF v_from >= v_last THEN
		RETURN v_from;
	END IF;
	BEGIN
		LOCK TABLE pgcoord.permit_events IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
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
CREATE FUNCTION pgcoord.janitor_fold_audit(p_limit integer)
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
			SELECT ev.key, sum(ev.delta),
			       max(ev.id) FILTER (WHERE ev.delta > 0),
			       max(ev.id) FILTER (WHERE ev.event = 'limit_set')
			FROM pgcoord.permit_events ev
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

-- Guarantee 2, verified in one statement (one snapshot, which sees a fold
-- whole or not at all): per quota, in_flight against the weights of its
-- permits that are not released and against the sum of its audit deltas
-- (the folded totals plus the rows after folded_upto); and in_flight over
-- the limit, which is a violation only if a permit was admitted after the
-- limit was last set (lowering a limit below in_flight is allowed and
-- admits nothing). Sequential scans are off: the planner cannot know that
-- folded_upto is near the end of the audit, nor may it read every permit.
CREATE FUNCTION pgcoord.permits_check()
RETURNS TABLE (key text, "limit" integer, in_flight bigint, permit_weights bigint,
	audit_sum bigint, problem text)
LANGUAGE sql STABLE SET enable_seqscan = off SET jit = off AS $$
	SELECT q.key::text, q."limit", q.in_flight, coalesce(w.s, 0)::bigint,
	       (coalesce(f.delta_sum, 0) + coalesce(e.s, 0))::bigint,
	       concat_ws('; ',
		CASE WHEN q.in_flight <> coalesce(w.s, 0)
		     THEN 'in_flight differs from the weights of its open permits' END,
		CASE WHEN q.in_flight <> coalesce(f.delta_sum, 0) + coalesce(e.s, 0)
		     THEN 'in_flight differs from the sum of its audit deltas' END,
		CASE WHEN q.in_flight > q."limit"
			  AND (greatest(f.last_set, e.last_set) IS NULL
			       OR coalesce(greatest(f.last_admit, e.last_admit), 0)
				  > greatest(f.last_set, e.last_set))
		     THEN 'in_flight exceeds the limit and a permit was admitted since it was set'
		END)
	FROM pgcoord.quotas q
	LEFT JOIN (SELECT pq.key, sum(pq.weight) AS s
		   FROM pgcoord.permits p
		   JOIN pgcoord.permit_quotas pq ON pq.permit_id = p.id
		   WHERE p.state <> 'released' GROUP BY pq.key) w ON w.key = q.key
	LEFT JOIN pgcoord.permit_audit_totals f ON f.key = q.key
	LEFT JOIN (SELECT ev.key, sum(ev.delta) AS s,
			  max(ev.id) FILTER (WHERE ev.delta > 0) AS last_admit,
			  max(ev.id) FILTER (WHERE ev.event = 'limit_set') AS last_set
		   FROM pgcoord.permit_events ev
		   WHERE ev.id > (SELECT h.folded_upto FROM pgcoord.permit_audit_horizon h
				     WHERE h.one)
		     AND ev.key IS NOT NULL
		   GROUP BY ev.key) e ON e.key = q.key
	ORDER BY q.key
$$;

SELECT pgcoord.secure_functions();
