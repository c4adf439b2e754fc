/*
 * config_peers.c — who is an admin and who may open sessions: the uid
 * lists and groups of the options, resolved once at load (so a request
 * never asks NSS, which may block), and the check of a peer against them.
 * Separate because it is the one part of loading that reads the host's
 * user and group databases.
 */
#include "agent/config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/config_internal.h"

static bool admins_add(struct admin_set *a, uid_t uid)
{
	uid_t *grown = realloc(a->uids, (a->nuids + 1) * sizeof(*grown));
	if (!grown)
		return false;
	a->uids = grown;
	a->uids[a->nuids++] = uid;
	return true;
}

/* Turns a uid list option and a group option (admin_uids/admin_group,
 * client_uids/client_group) into a set, with a message that names the bad
 * value: a typo here would silently lock operators or clients out. */
static bool resolve_uid_set(struct admin_set *a, const char *uids_name, const char *uids,
			    const char *group_name, const char *group, char *err, size_t errlen)
{
	const char *p = uids;

	free(a->uids);
	memset(a, 0, sizeof(*a));
	while (*p) {
		char *end;
		unsigned long v;
		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		errno = 0;
		v = strtoul(p, &end, 10);
		if (errno || end == p || !isdigit((unsigned char)*p) || v >= UINT_MAX ||
		    (*end && *end != ',' && *end != ' ')) {
			snprintf(err, errlen,
				 "%s: \"%s\" is not a comma-separated list of numeric uids",
				 uids_name, uids);
			return false;
		}
		if (!admins_add(a, (uid_t)v)) {
			snprintf(err, errlen, "%s: out of memory", uids_name);
			return false;
		}
		p = end;
	}
	if (group[0]) {
		struct group *g;
		errno = 0;
		g = getgrnam(group);
		if (!g && errno) {
			snprintf(err, errlen, "%s: cannot look up group \"%s\": %s", group_name,
				 group, strerror(errno));
			return false;
		}
		if (!g) {
			snprintf(err, errlen, "%s: no group named \"%s\" on this host", group_name,
				 group);
			return false;
		}
		a->has_group = true;
		a->gid = g->gr_gid;
		/* members listed by name; a name with no user is skipped (it
		 * can authenticate nobody) */
		for (char **m = g->gr_mem; m && *m; m++) {
			struct passwd *pw = getpwnam(*m);
			if (pw && !admins_add(a, pw->pw_uid)) {
				snprintf(err, errlen, "%s: out of memory", group_name);
				return false;
			}
		}
	}
	return true;
}

/* Who is an admin, and who may open sessions. */
bool config_resolve_peer_sets(struct config *cfg, char *err, size_t errlen)
{
	return resolve_uid_set(&cfg->admins, "admin_uids", cfg->admin_uids, "admin_group",
			       cfg->admin_group, err, errlen) &&
	       resolve_uid_set(&cfg->clients, "client_uids", cfg->client_uids, "client_group",
			       cfg->client_group, err, errlen);
}

bool uid_set_has(const struct admin_set *set, uid_t uid, gid_t gid)
{
	if (set->has_group && gid == set->gid)
		return true;
	for (size_t i = 0; i < set->nuids; i++)
		if (set->uids[i] == uid)
			return true;
	return false;
}
