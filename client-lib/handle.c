/*
 * handle.c — what every other file of the library uses on a handle: the
 * last message, encoding (struct pgcoord_writer), closing the socket, and
 * checking an options struct's size. It calls nothing above transport.c
 * and beliefs.c, so the framing, the call core and the typed calls all
 * sit on it (see handle.h for the layers).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <msgpack.h>

#include "handle.h"

void pgcoord__set_message(pgcoord *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->message, sizeof(c->message), fmt, ap);
	va_end(ap);
}

void pgcoord__disconnect(pgcoord *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	/* No lease.changed can reach us any more: stop believing now. */
	pgcoord__beliefs_end(c);
}

static int writer_write(void *data, const char *buf, size_t len)
{
	struct pgcoord_writer *w = data;

	if (w->failed || msgpack_sbuffer_write(&w->sb, buf, len) != 0) {
		w->failed = true;
		return -1;
	}
	return 0;
}

void pgcoord__writer_raw(struct pgcoord_writer *w, const char *buf, size_t len)
{
	(void)writer_write(w, buf, len);
}

void pgcoord__writer_init(struct pgcoord_writer *w)
{
	msgpack_sbuffer_init(&w->sb);
	msgpack_packer_init(&w->pk, w, writer_write);
	w->failed = false;
}

char *pgcoord__writer_release(struct pgcoord_writer *w, size_t *len)
{
	*len = 0;
	if (w->failed || w->sb.size == 0) {
		msgpack_sbuffer_destroy(&w->sb);
		msgpack_sbuffer_init(&w->sb);
		return NULL;
	}
	*len = w->sb.size;
	return msgpack_sbuffer_release(&w->sb);
}

void pgcoord__writer_destroy(struct pgcoord_writer *w)
{
	msgpack_sbuffer_destroy(&w->sb);
	msgpack_sbuffer_init(&w->sb);
}

pgcoord_err pgcoord__encode(const msgpack_object *o, char **out, size_t *len)
{
	struct pgcoord_writer w;

	pgcoord__writer_init(&w);
	msgpack_pack_object(&w.pk, *o);
	*out = pgcoord__writer_release(&w, len);
	return *out ? PGCOORD_OK : PGCOORD_E_NOMEM;
}

void pgcoord_free(void *p)
{
	free(p);
}

bool pgcoord__opts_size_ok(pgcoord *c, const void *opts, size_t size, size_t min, size_t max,
			   const char *init)
{
	if (opts && size >= min && size <= max)
		return true;
	if (!opts)
		pgcoord__set_message(c, "opts is NULL (start from %s)", init);
	else
		pgcoord__set_message(c,
				     "opts.size %zu is not one this library knows (%zu..%zu; "
				     "start from %s)",
				     size, min, max, init);
	return false;
}
