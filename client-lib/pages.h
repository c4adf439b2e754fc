/*
 * pages.h — walking the paged lists (pages.c).
 */
#ifndef PGCOORD_CLIENT_PAGES_H
#define PGCOORD_CLIENT_PAGES_H

#include <stddef.h>

#include "handle.h"

/* The page size a walk asks for: the cap of lease.list, quota.list,
 * fleet.agents and fleet.sessions (PROTOCOL.md, "Paging"). */
#define PGCOORD__PAGE_MAX 1000

/*
 * Every page of method (params: a packed map of its filters, or NULL),
 * answered as one result map: the rows of every page under `items`, the
 * other keys of the last page, next_cursor nil and truncated false. One
 * timeout for the whole walk.
 */
PGCOORD_WUR pgcoord_err pgcoord__list_all(pgcoord *c, const char *method, const void *params,
					  size_t params_len, const char *items, int timeout_ms,
					  void **result, size_t *result_len);

#endif
