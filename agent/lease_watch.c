/*
 * lease_watch.c — polls the leases sessions watch (lease.status
 * watch=true) and tells each watcher that does not hold one when its
 * holder or epoch changed.
 */
#include <stdlib.h>
#include <string.h>

#include "agent/conn.h"
#include "agent/db.h"
#include "agent/lease_registry.h"
#include "agent/leases.h"
#include "agent/session_registry.h"

static void poll_done(const struct db_result *r, void *arg)
{
	struct agent *ag = arg;
	struct lease_registry *rg = lease_reg(ag);
	rg->poll_in_flight = false;
	if (!r->ok)
		return;
	for (int i = 0; i < PQntuples(r->res); i++) {
		const char *name = PQgetvalue(r->res, i, 0);
		int64_t epoch = strtoll(PQgetvalue(r->res, i, 1), NULL, 10);
		bool held = strcmp(PQgetvalue(r->res, i, 8), "t") == 0;
		int64_t holder = held ? strtoll(PQgetvalue(r->res, i, 2), NULL, 10) : 0;
		for (struct lease_watch *w = rg->watches; w; w = w->next) {
			if (strcmp(w->name, name) != 0)
				continue;
			bool changed = w->primed && (w->epoch != epoch || w->holder != holder);
			w->primed = true;
			w->epoch = epoch;
			w->holder = holder;
			struct session *s = sessions_find(ag, w->session_id);
			/* a watcher that holds the lease hears of its own belief
			 * from belief_start/lease_end_belief; this is for the others
			 * (tmp has no deadline: it would say leader, valid_ms 0) */
			if (!changed || !s || !s->conn || leases_believes(ag, name, w->session_id))
				continue;
			struct lease tmp = {.name = (char *)name,
					    .epoch = epoch,
					    .session_id = w->session_id,
					    .ag = ag};
			struct change_note note = {&tmp,
						   false,
						   "holder changed",
						   holder,
						   held ? PQgetvalue(r->res, i, 3) : NULL,
						   false};
			lease_tell(s->conn, &note);
		}
	}
}

void lease_watch_poll_cb(evutil_socket_t fd, short what, void *arg)
{
	struct agent *ag = arg;
	struct lease_registry *rg = lease_reg(ag);
	size_t cap = 3, n = 0;
	(void)fd;
	(void)what;

	if (!rg->watches || rg->poll_in_flight || !ag->id.registered)
		return;
	/* a Postgres text[] literal with every name quoted and escaped */
	for (struct lease_watch *w = rg->watches; w; w = w->next)
		cap += 2 * strlen(w->name) + 4;
	char *arr = malloc(cap);
	if (!arr)
		return;
	arr[n++] = '{';
	for (struct lease_watch *w = rg->watches; w; w = w->next) {
		if (n > 1)
			arr[n++] = ',';
		arr[n++] = '"';
		for (const char *p = w->name; *p; p++) {
			if (*p == '"' || *p == '\\')
				arr[n++] = '\\';
			arr[n++] = *p;
		}
		arr[n++] = '"';
	}
	arr[n++] = '}';
	arr[n] = '\0';
	const char *params[1] = {arr};
	if (db_query(ag->db, DB_LANE_REQUESTS, LEASE_COLUMNS "WHERE name = ANY ($1::text[])", 1,
		     params, poll_done, ag))
		rg->poll_in_flight = true;
	free(arr);
}
