/*
 * agent.h — the one context every module of pgcoord-agent receives.
 * There are no mutable globals: a test can build an agent by hand.
 */
#ifndef PGCOORD_AGENT_AGENT_H
#define PGCOORD_AGENT_AGENT_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/config.h"
#include "agent/log.h"

#define PGCOORD_VERSION_STRING "0.1.0"

struct db;
struct listener;
struct conn;
struct session;
struct lease_registry;
struct janitor;
struct metrics;
struct heartbeat_hooks;
struct conn_hooks;
struct http;
struct watch_registry;
struct waiter_registry;
struct group;

enum agent_state {
	AGENT_STARTING,	  /* serving agent.* only; waiting for the database */
	AGENT_SERVING,	  /* registered: every method is served */
	AGENT_STOPPING,	  /* SIGTERM: handing back, closing sessions */
	AGENT_SUPERSEDED, /* lost the replica_id: telling clients, then exiting */
};

struct identity {
	int64_t incarnation; /* random, new at every start */
	char host[256];
	bool registered;
	int schema_version;
	bool hb_in_flight;
	uint64_t hb_last_sent_ms;  /* CLOCK_MONOTONIC send time of the last heartbeat */
	uint64_t hb_last_ok_ms;	   /* send time of the last heartbeat that succeeded */
	int64_t db_now_ms;	   /* database clock at the last successful heartbeat */
	bool suspended;		   /* clients were told session.suspended */
	struct event *fence_timer; /* suspends, then loses, sessions when heartbeats fail */
	struct event *hb_timer;
	const struct heartbeat_hooks *hb_hooks; /* identity.c's, told each answer */
	struct event *register_timer;
};

struct agent {
	struct event_base *base;
	struct config cfg;
	const char *config_path;
	struct logger log;
	struct db *db;
	struct listener *listener;
	struct conn *conns;		     /* every open client connection */
	const struct conn_hooks *conn_hooks; /* main.c's: frames to dispatch, closes to sessions */
	int nconns;
	uint64_t next_conn_id;	  /* for log correlation */
	struct session *sessions; /* every session this incarnation holds */
	int nsessions;
	struct identity id;
	struct lease_registry *leases;
	struct watch_registry *watches;	 /* quota, permit and record watches */
	struct waiter_registry *waiters; /* waiting claims of this agent's sessions */
	struct janitor *janitor;
	enum agent_state state;
	uint64_t started_ms;
	int exit_code;
	struct event *sig_term, *sig_int, *sig_hup;
	struct event *grace_timer;
	struct event *stop_timer;
	struct event *watchdog_timer;
	struct event *notify_status_timer;
	char notify_last_status[256]; /* the STATUS= systemd has */
	/* the flags given at start (after --config), read again on SIGHUP */
	int argc;
	char **argv;
	struct metrics *metrics;
	struct http *http;
	/* claims and releases waiting at the same moment share a statement */
	/* the fast kinds (one SQL statement), and the group functions they
	 * hand every other call to */
	struct group *claim_group, *release_group;
	struct group *claim_slow_group, *release_slow_group;
};

/* CLOCK_MONOTONIC in milliseconds: every local deadline uses it. */
uint64_t mono_ms(void);

/* Ends the loop with this exit code after pending output is flushed. */
void agent_exit(struct agent *ag, int code);

#endif
