-- Least privilege: the role that runs migrations (the owner) keeps the DDL;
-- the agent runs as a runtime role that can only EXECUTE the pgcoord
-- functions and SELECT what the agent reads directly. It cannot INSERT,
-- UPDATE, DELETE or TRUNCATE anything, nor change the schema.
--
-- Every function is SECURITY DEFINER, so it works on the tables with its
-- owner's rights and the runtime role needs none of its own; its
-- search_path is pinned, so objects a caller puts in another schema or in
-- pg_temp cannot stand in for ours or for pg_catalog's; and PUBLIC may not
-- execute it. Its statements are never JIT-compiled: they are short
-- lookups by key, and a plan priced above jit_above_cost (a function that
-- turns enable_seqscan off prices any sequential scan it must keep at
-- 10^10) would compile for up to a second on every call.
--
-- New functions start without those attributes: pgcoord.secure_functions()
-- applies them to every function in the schema. Every migration calls it
-- last, in its own transaction, so a later failing migration cannot leave
-- its functions bare, and the migration runner calls it after every run.
-- Likewise pgcoord.grant_runtime(role) grants what exists when it is
-- called, so `pgcoord-agent migrate --runtime-role` calls it after every
-- run.

CREATE FUNCTION pgcoord.secure_functions()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
	f record;
	n integer := 0;
BEGIN
	FOR f IN
		-- argument types, and ALTER FUNCTION (not ROUTINE, which also matches
		-- OUT arguments): an overload adding a parameter stays unambiguous
		SELECT p.oid::pg_catalog.regprocedure::text AS sig
		FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
		WHERE ns.nspname = 'pgcoord' AND p.prokind = 'f'
	LOOP
		EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER '
			       'SET search_path = pg_catalog, pgcoord, pg_temp SET jit = off',
			       f.sig);
		EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
		n := n + 1;
	END LOOP;
	RETURN n;
END $$;

-- Grants the runtime role what the agent needs: the schema, every function
-- but these two (they are the owner's), and SELECT on the tables and views
-- the agent reads directly (status, fleet views, permit reads, the schema
-- version). Called by the owner; the role must exist.
CREATE FUNCTION pgcoord.grant_runtime(p_role name)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	f record;
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA pgcoord TO %I', p_role);
	FOR f IN
		-- argument types, and ALTER FUNCTION (not ROUTINE, which also matches
		-- OUT arguments): an overload adding a parameter stays unambiguous
		SELECT p.oid::pg_catalog.regprocedure::text AS sig
		FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
		WHERE ns.nspname = 'pgcoord' AND p.prokind = 'f'
		  AND p.proname NOT IN ('secure_functions', 'grant_runtime')
	LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.sig, p_role);
	END LOOP;
	EXECUTE format('GRANT SELECT ON pgcoord.schema_migrations, pgcoord.agents, '
		       'pgcoord.live_sessions, pgcoord.leases, pgcoord.permits, '
		       'pgcoord.permit_quotas, pgcoord.permit_events, pgcoord.permit_status, '
		       'pgcoord.quota_status, pgcoord.record_status TO %I', p_role);
END $$;
