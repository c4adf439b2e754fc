/*
 * ctl_watch.c — see ctl_watch.h.
 */
#include "ctl_watch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>

#include "ctl_print.h"
#include "pgcoord/pgcoord.h"
#include "ctl_msgpack.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_NOCONNECT = 3, EXIT_IO = 4 };

/* How often the loop looks at the stop flag while no event arrives. */
#define CTL_WATCH_TICK_MS 200

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig)
{
	(void)sig;
	stop_requested = 1;
}

struct watcher {
	const struct ctl_watch_options *opt;
	int64_t watch_id;
	bool waiting;	/* wait: stop at the first quota.changed with room */
	bool satisfied; /* wait: it came */
	bool lost;	/* the session was lost: nothing more will come */
};

static int exit_for(pgcoord_err err)
{
	switch (err) {
	case PGCOORD_OK:
		return EXIT_OK;
	case PGCOORD_E_CONNECT:
		return EXIT_NOCONNECT;
	case PGCOORD_E_IO:
	case PGCOORD_E_CALL_TIMEOUT:
	case PGCOORD_E_CLOSED:
	case PGCOORD_E_PROTOCOL:
		return EXIT_IO;
	default:
		return EXIT_FAILED;
	}
}

static int fail(pgcoord *c, const char *what, pgcoord_err err)
{
	const char *msg = c ? pgcoord_last_message(c) : "";
	fprintf(stderr, "pgcoordctl: %s: %s%s%s\n", what, pgcoord_strerror(err), *msg ? ": " : "",
		msg);
	return exit_for(err);
}

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One line: the event and its params, without the watch id (this process
 * has one watch). Text is key=value pairs; --json one object. */
static void print_event(const struct watcher *w, const char *method, const msgpack_object *p)
{
	if (w->opt->json) {
		msgpack_sbuffer sb;
		msgpack_packer pk;
		msgpack_unpacked u;
		size_t n = 1, off = 0;
		for (uint32_t i = 0; p && i < p->via.map.size; i++)
			n += !ctl_obj_str_eq(&p->via.map.ptr[i].key, "watch");
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, n);
		ctl_pack_kv_str(&pk, "event", method);
		for (uint32_t i = 0; p && i < p->via.map.size; i++) {
			if (ctl_obj_str_eq(&p->via.map.ptr[i].key, "watch"))
				continue;
			msgpack_pack_object(&pk, p->via.map.ptr[i].key);
			msgpack_pack_object(&pk, p->via.map.ptr[i].val);
		}
		msgpack_unpacked_init(&u);
		if (msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
			ctl_print_json_line(stdout, &u.data);
		msgpack_unpacked_destroy(&u);
		msgpack_sbuffer_destroy(&sb);
	} else {
		fputs(method, stdout);
		for (uint32_t i = 0; p && i < p->via.map.size; i++) {
			const msgpack_object *k = &p->via.map.ptr[i].key;
			char value[512];
			if (k->type != MSGPACK_OBJECT_STR || ctl_obj_str_eq(k, "watch"))
				continue;
			char key[64];
			snprintf(key, sizeof(key), "%.*s", (int)k->via.str.size, k->via.str.ptr);
			/* as the tables show it: instants as ages, nil as "-" */
			ctl_format_value(value, sizeof(value), key, &p->via.map.ptr[i].val,
					 CTL_FMT_AUTO, wall_ms());
			printf(" %s=%s", key, value);
		}
		fputc('\n', stdout);
	}
	fflush(stdout);
}

static void on_notify(void *user, const char *method, const void *params, size_t len)
{
	struct watcher *w = user;
	msgpack_unpacked u;
	size_t off = 0;
	int64_t watch = 0, room = 0;
	bool exists = false;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, params, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		msgpack_unpacked_destroy(&u);
		return;
	}
	const msgpack_object *p = &u.data;
	/* another watch's (none here, but a resumed session might have some) */
	if (ctl_obj_int64(ctl_map_get(p, "watch"), &watch) && watch != w->watch_id) {
		msgpack_unpacked_destroy(&u);
		return;
	}
	if (strcmp(method, "session.lost") == 0)
		w->lost = true;
	if (!w->waiting) {
		print_event(w, method, p);
	} else if (strcmp(method, "quota.changed") == 0 &&
		   ctl_obj_bool(ctl_map_get(p, "exists"), &exists) && exists &&
		   ctl_obj_int64(ctl_map_get(p, "room"), &room) && room >= w->opt->room) {
		w->satisfied = true;
		print_event(w, method, p);
	}
	msgpack_unpacked_destroy(&u);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int run(const struct ctl_watch_options *opt, bool waiting)
{
	struct watcher w = {.opt = opt, .waiting = waiting};
	struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
	int64_t deadline = opt->wait_ms >= 0 ? now_ms() + opt->wait_ms : -1;
	pgcoord *c = NULL;
	pgcoord_err err;
	int rc = EXIT_OK;

	err = pgcoord_connect(opt->socket_path, opt->call_timeout_ms, &c);
	if (err != PGCOORD_OK) {
		fprintf(stderr, "pgcoordctl: cannot connect to the agent at %s: %s\n",
			opt->socket_path,
			err == PGCOORD_E_CONNECT ? strerror(errno) : pgcoord_strerror(err));
		return exit_for(err);
	}
	pgcoord_set_notify(c, on_notify, &w);
	err = pgcoord_session_open(c, waiting ? "pgcoordctl wait" : "pgcoordctl watch",
				   opt->call_timeout_ms, NULL);
	if (err != PGCOORD_OK) {
		rc = fail(c, "session.open", err);
		pgcoord_close(c);
		return rc;
	}
	if (strcmp(opt->what, "quota") == 0)
		err = pgcoord_quota_watch(c, opt->target, opt->call_timeout_ms, &w.watch_id);
	else if (strcmp(opt->what, "permit") == 0)
		err = pgcoord_permit_watch(c, opt->target, opt->call_timeout_ms, &w.watch_id);
	else
		err = pgcoord_record_watch(c, opt->target, opt->call_timeout_ms, &w.watch_id);
	if (err != PGCOORD_OK) {
		rc = fail(c, "watch", err);
		pgcoord_session_close(c, opt->call_timeout_ms);
		pgcoord_close(c);
		return rc;
	}

	stop_requested = 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	while (!stop_requested && !w.satisfied && !w.lost) {
		int tick = CTL_WATCH_TICK_MS;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			if (left <= 0) {
				fprintf(
				    stderr,
				    "pgcoordctl: wait: quota \"%s\" had no room for %lld within "
				    "%d ms\n",
				    opt->target, (long long)opt->room, opt->wait_ms);
				rc = CTL_WAIT_EXIT_TIMEOUT;
				break;
			}
			if (left < tick)
				tick = (int)left;
		}
		err = pgcoord_poll(c, tick, NULL);
		if (err != PGCOORD_OK) {
			rc = fail(c, "the connection to the agent", err);
			break;
		}
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (w.lost) {
		fprintf(stderr, "pgcoordctl: the session was lost; watch again\n");
		rc = EXIT_FAILED;
	}
	/* the watch ends with the session: no grace to wait out */
	if (!w.lost && pgcoord_fd(c) >= 0)
		(void)pgcoord_session_close(c, opt->call_timeout_ms);
	pgcoord_close(c);
	return rc;
}

int ctl_watch(const struct ctl_watch_options *opt)
{
	return run(opt, false);
}

int ctl_wait(const struct ctl_watch_options *opt)
{
	return run(opt, true);
}
