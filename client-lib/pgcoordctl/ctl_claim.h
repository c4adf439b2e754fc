/*
 * ctl_claim.h — `pgcoordctl claim` (take a permit, waiting in the queue
 * when asked) and `pgcoordctl cancel` (take a waiting claim out of it), on
 * libpgcoord's permit calls (PROTOCOL.md, "Permits", "Waiting claims").
 */
#ifndef PGCOORD_CTL_CLAIM_H
#define PGCOORD_CTL_CLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ctl_claim_options {
	const char *socket_path;
	int call_timeout_ms; /* connect and each call */
	bool json;
	const char *id;
	const char *const *keys; /* nquotas quota keys, with their weights */
	const int32_t *weights;
	size_t nquotas;
	int64_t wait_ms;    /* 0: answer at once; else queue for up to this long */
	const char *intent; /* NULL: none */
};

/*
 * Opens a session, claims and prints the admission (id, status, token,
 * session; with --wait also how long it queued). Exits 0 when admitted or
 * held, 1 when denied or when the wait ended unadmitted (the message says
 * which quota refused, or why it left the queue), 3 when the agent cannot
 * be reached, 4 when the connection fails. The permit belongs to this
 * command's session: when it ends (at exit, after the grace period) the
 * permit stays counted as uncertain until it is released or resolved.
 */
int ctl_claim(const struct ctl_claim_options *opt);

/* Opens a session and cancels waiting claim id (an admin may cancel any
 * session's). Exits 0 when it left the queue, 1 when it is a permit
 * already or unknown, 3 and 4 as above. */
int ctl_cancel(const struct ctl_claim_options *opt);

#endif
