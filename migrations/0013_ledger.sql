-- The ledger's fast path without the quota row's extra lock.
--
-- Nobody overtakes a queue (0006_waiting_claims.sql): every writer that
-- raises a quota's in_flight tests it itself, under the row lock. An
-- immediate claim's UPDATE has `q.waiting = 0` in its WHERE
-- (permit_claim_as), a claim group judges its members against counters
-- read under the rows' locks and admits nothing on a quota with waiters
-- (permit_claim_group), and the hand-over raises in_flight past a queue on
-- purpose, with pgcoord.handing_over on. quotas_no_overtaking was the
-- backstop behind them as a BEFORE ROW trigger, and PostgreSQL locks the row
-- for a BEFORE ROW trigger before it evaluates the trigger's WHEN: one
-- Heap/LOCK WAL record (54 bytes) and a tuple lock on every claim's counter
-- update, though the WHEN is false on every one of them.
--
-- The backstop is now an AFTER ROW trigger with the same condition in its
-- WHEN, which is evaluated on the old and new row the update already has:
-- nothing is locked or queued when it is false. Where it is true (a writer
-- that forgot the queue) the statement fails with check_violation instead
-- of the update being skipped: an overtaking is refused either way, and a
-- writer's defect is no longer answered as a quiet denial.
--
-- Nothing else changes: no table, row or function the agent calls, so a
-- database in use upgrades in one short transaction (DROP TRIGGER takes
-- the quotas table's lock for that moment), with its held, uncertain and
-- queued permits and their history as they were.

CREATE FUNCTION pgcoord.quotas_no_overtaking_check()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	-- not a refusal (class PC): a writer's defect, answered as a check of
	-- the table would be
	RAISE check_violation USING
		MESSAGE = format('in_flight of quota %s raised past its %s waiting claim(s)',
			NEW.key, OLD.waiting),
		HINT = 'an immediate claim must test waiting = 0 under the row lock';
END $$;

DROP TRIGGER quotas_no_overtaking ON pgcoord.quotas;

CREATE TRIGGER quotas_no_overtaking AFTER UPDATE OF in_flight ON pgcoord.quotas
	FOR EACH ROW
	WHEN (NEW.in_flight > OLD.in_flight AND OLD.waiting > 0
	      AND current_setting('pgcoord.handing_over', true) IS DISTINCT FROM 'on')
	EXECUTE FUNCTION pgcoord.quotas_no_overtaking_check();

SELECT pgcoord.secure_functions();
