-- BROKEN ON PURPOSE (test builds only): the hand-over serves the newest
-- waiter first. When room comes, the queue admits its latest arrival, and
-- every waiter that joined before it waits on (last in, first out). Each
-- admission still fits its slot, so quota_limit holds; the soak checker
-- must report queue_order.
-- @function pgcoord.waiters_admit
-- @replace
		 ORDER BY x.seq
	LOOP
		-- head-of-line: an earlier waiter on any of its quotas goes first
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgcoord.waiters e WHERE e.state = 'queued'
				      AND e.seq < w.seq AND e.keys && w.keys);
-- @with
		 ORDER BY x.seq DESC
	LOOP
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgcoord.waiters e WHERE e.state = 'queued'
				      AND e.seq > w.seq AND e.keys && w.keys);
-- @end
