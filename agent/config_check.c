/*
 * config_check.c — the checks a loaded configuration must pass before the
 * agent starts (config_validate): database_url as libpq parses it,
 * metrics_listen as a loopback address, the cross-option bounds; and the
 * redaction of a conninfo's password for anything printed. Separate from
 * loading: each check reads the whole configuration.
 */
#include "agent/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Parses database_url as libpq will, so a malformed one stops the agent at
 * start rather than failing every connection attempt later. libpq's message
 * may quote a fragment of the string (`missing "=" after "b"`), which can be
 * part of an unquoted password: when the string holds a password, the
 * message is withheld and only a hint given.
 */
static bool check_database_url(const char *url, char *err, size_t errlen)
{
	char *pqerr = NULL, *redacted;
	PQconninfoOption *opts;
	bool secret;

	if (!url[0])
		return true;
	opts = PQconninfoParse(url, &pqerr);
	if (opts) {
		PQconninfoFree(opts);
		return true;
	}
	redacted = config_redact_conninfo(url);
	secret = !redacted || strcmp(redacted, url) != 0;
	free(redacted);
	if (pqerr) {
		for (char *p = pqerr; *p; p++)
			if (*p == '\n')
				*p = p[1] ? ' ' : '\0';
	}
	if (secret || !pqerr)
		snprintf(err, errlen,
			 "database_url: libpq cannot parse it (its message is withheld: it may "
			 "quote the password); check the key=value pairs, and quote values "
			 "with spaces in single quotes, or the URI's percent-encoding");
	else
		snprintf(err, errlen, "database_url: libpq cannot parse it: %s", pqerr);
	PQfreemem(pqerr);
	return false;
}

bool config_validate(const struct config *cfg, char *err, size_t errlen)
{
	if (strlen(cfg->replica_id) > 200) {
		snprintf(err, errlen, "replica_id: longer than 200 bytes");
		return false;
	}
	if (cfg->socket_path[0] != '/') {
		snprintf(err, errlen, "socket_path: \"%s\" must be an absolute path",
			 cfg->socket_path);
		return false;
	}
	if (strlen(cfg->socket_path) >= 108) {
		snprintf(err, errlen,
			 "socket_path: longer than a Unix socket path may be (107 bytes)");
		return false;
	}
	if (!check_database_url(cfg->database_url, err, errlen))
		return false;
	if (cfg->metrics_listen[0]) {
		struct sockaddr_storage ss;
		socklen_t sslen;
		char why[256];
		if (!config_parse_listen(cfg->metrics_listen, &ss, &sslen, why, sizeof(why))) {
			snprintf(err, errlen, "metrics_listen: %s", why);
			return false;
		}
	}
	/* a purged tombstone stops guarding its id: refuse a window a retry
	 * could plausibly outlive */
	if (cfg->retention_s > 0 && cfg->retention_s < 3600) {
		snprintf(err, errlen,
			 "retention_s (%d) must be 0 (keep everything) or at least 3600: a "
			 "duplicate claim arriving after its permit was deleted is admitted as new",
			 cfg->retention_s);
		return false;
	}
	/* three heartbeats must fit in a ttl, so one slow or lost heartbeat
	 * never lets a live session lapse */
	if (cfg->heartbeat_interval_ms * 3 > cfg->session_ttl_ms) {
		snprintf(err, errlen,
			 "heartbeat_interval_ms (%d) must be at most a third of session_ttl_ms "
			 "(%d): raise session_ttl_ms or lower heartbeat_interval_ms",
			 cfg->heartbeat_interval_ms, cfg->session_ttl_ms);
		return false;
	}
	return true;
}

bool config_parse_listen(const char *text, struct sockaddr_storage *out, socklen_t *outlen,
			 char *why, size_t whylen)
{
	char host[64];
	const char *colon, *port;
	size_t hlen;
	char *end;
	long pnum;

	if (text[0] == '[') {
		const char *close = strchr(text, ']');
		if (!close || close[1] != ':') {
			snprintf(why, whylen, "\"%s\" is not [ipv6]:port (example: [::1]:9187)",
				 text);
			return false;
		}
		hlen = (size_t)(close - text - 1);
		if (hlen >= sizeof(host))
			hlen = sizeof(host) - 1;
		memcpy(host, text + 1, hlen);
		port = close + 2;
	} else {
		colon = strrchr(text, ':');
		if (!colon) {
			snprintf(why, whylen,
				 "\"%s\" has no port (expected address:port, example: "
				 "127.0.0.1:9187)",
				 text);
			return false;
		}
		hlen = (size_t)(colon - text);
		if (hlen >= sizeof(host))
			hlen = sizeof(host) - 1;
		memcpy(host, text, hlen);
		port = colon + 1;
	}
	host[hlen] = '\0';
	errno = 0;
	pnum = strtol(port, &end, 10);
	if (errno || end == port || *end || pnum < 0 || pnum > 65535) {
		snprintf(why, whylen, "\"%s\" is not a port number (0..65535)", port);
		return false;
	}
	memset(out, 0, sizeof(*out));
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	struct sockaddr_in *v4 = (struct sockaddr_in *)out;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)out;
	if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)pnum);
		*outlen = sizeof(*v4);
		/* 127.0.0.0/8 */
		if ((ntohl(v4->sin_addr.s_addr) >> 24) == 127)
			return true;
	} else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)pnum);
		*outlen = sizeof(*v6);
		if (IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr))
			return true;
	} else {
		snprintf(why, whylen,
			 "\"%s\" is not a numeric IP address (use 127.0.0.1, [::1] or localhost)",
			 host);
		return false;
	}
	snprintf(why, whylen,
		 "%s is not a loopback address; the HTTP pages have no authentication, so the "
		 "agent serves them on 127.0.0.0/8 or ::1 only (put a proxy in front to expose "
		 "them)",
		 host);
	return false;
}

char *config_redact_conninfo(const char *conninfo)
{
	size_t len = strlen(conninfo);
	/* each redaction writes 4 bytes where at least "password=" stood, plus
	 * at most one in a URI's user info */
	char *out = malloc(2 * len + 16);
	const char *in = conninfo;
	const char *scheme = strstr(conninfo, "://");
	char *o = out;

	if (!out)
		return NULL;
	if (scheme) {
		const char *creds = scheme + 3;
		const char *at = strchr(creds, '@');
		const char *colon = strchr(creds, ':');
		const char *slash = strchr(creds, '/');
		if (at && colon && colon < at && (!slash || at < slash)) {
			memcpy(o, in, (size_t)(colon + 1 - in));
			o += colon + 1 - in;
			memcpy(o, "****", 4);
			o += 4;
			in = at;
		}
	}
	while (*in) {
		if (strncmp(in, "password", 8) == 0) {
			const char *v = in + 8;
			while (*v == ' ')
				v++;
			if (*v == '=') {
				v++;
				while (*v == ' ')
					v++;
				memcpy(o, "password=****", 13);
				o += 13;
				if (*v == '\'') {
					for (v++; *v && *v != '\'';
					     v += (*v == '\\' && v[1]) ? 2 : 1)
						;
					if (*v)
						v++;
				} else {
					while (*v && *v != ' ' && *v != '&')
						v++;
				}
				in = v;
				continue;
			}
		}
		*o++ = *in++;
	}
	*o = '\0';
	return out;
}
