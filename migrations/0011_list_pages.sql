-- Pages of quota.list: keyset paging (the agent's cursor.h) reads a page
-- as `key > last ORDER BY key LIMIT n`, an index range scan. quota_status
-- groups every quota with the open permits' shares, so a key range put
-- on the view is filtered after that grouping: every quota from the
-- cursor on is summed and sorted to keep a hundred. This function takes
-- the page's keys from quotas_pkey first (the agent reads no table but
-- through views and functions) and hands them to the view as one array,
-- which the view's grouping column takes into its scan of quotas: only
-- the page's quotas are summed. The open permits' shares are read once,
-- as for quota.get.

CREATE FUNCTION pgcoord.quota_page(p_after text, p_limit integer)
RETURNS SETOF pgcoord.quota_status
LANGUAGE sql STABLE AS $$
	SELECT s.* FROM pgcoord.quota_status s
	WHERE s.key = ANY (ARRAY(SELECT q.key::text FROM pgcoord.quotas q
				 WHERE q.key > p_after ORDER BY q.key LIMIT p_limit))
	ORDER BY s.key
$$;

SELECT pgcoord.secure_functions();
