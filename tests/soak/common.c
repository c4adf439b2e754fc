/*
 * common.c — time, the seeded PRNG and the JSON-lines history writer shared
 * by the soak driver's processes. See soak.h.
 */
#include "soak.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A hot key that every client fights over, and two roomier quotas that
 * multi-quota claims take together (in key order, all or nothing). */
const struct soak_quota soak_quotas[SOAK_NQUOTAS] = {
    {"soak.hot", 3},
    {"soak.q1", 12},
    {"soak.q2", 12},
};

void soak_lease_name(int i, char *buf, size_t size)
{
	snprintf(buf, size, "soak-lead-%d", i);
}

int64_t soak_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void soak_sleep_ms(int64_t ms, volatile sig_atomic_t *stop)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)(ms % 1000) * 1000000;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		if (stop && *stop)
			return;
}

uint64_t soak_rand(struct soak_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int64_t soak_rand_range(struct soak_rng *r, int64_t lo, int64_t hi)
{
	if (hi <= lo)
		return lo;
	return lo + (int64_t)(soak_rand(r) % (uint64_t)(hi - lo + 1));
}

bool soak_chance(struct soak_rng *r, double p)
{
	return (double)(soak_rand(r) >> 11) * (1.0 / 9007199254740992.0) < p;
}

int64_t soak_rand_exp(struct soak_rng *r, double mean)
{
	double u = ((double)(soak_rand(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);

	return mean <= 0 ? 0 : (int64_t)(-log(u) * mean);
}

uint64_t soak_derive_seed(uint64_t seed, uint64_t who)
{
	struct soak_rng r = {seed ^ (who * 0xd1b54a32d192ed03ull)};

	return soak_rand(&r);
}

/* --- history -------------------------------------------------------------- */

bool hist_open(struct hist *h, const char *path)
{
	memset(h, 0, sizeof(*h));
	h->f = fopen(path, "we");
	if (!h->f)
		return false;
	/* whole lines only, so a process killed mid-run leaves a readable file */
	setvbuf(h->f, NULL, _IOFBF, 1 << 16);
	h->cap = 4096;
	h->buf = malloc(h->cap);
	return h->buf != NULL;
}

void hist_flush(struct hist *h)
{
	if (h->f)
		fflush(h->f);
}

void hist_close(struct hist *h)
{
	if (h->f)
		fclose(h->f);
	free(h->buf);
	memset(h, 0, sizeof(*h));
}

static void put(struct hist *h, const char *s, size_t n)
{
	if (h->failed)
		return;
	if (h->len + n + 1 > h->cap) {
		size_t cap = h->cap * 2 > h->len + n + 1 ? h->cap * 2 : h->len + n + 1;
		char *b = realloc(h->buf, cap);

		if (!b) {
			h->failed = true;
			return;
		}
		h->buf = b;
		h->cap = cap;
	}
	memcpy(h->buf + h->len, s, n);
	h->len += n;
}

static void puts_(struct hist *h, const char *s)
{
	put(h, s, strlen(s));
}

void hist_json_escape(char *out, size_t size, const char *s)
{
	size_t n = 0;

	if (size == 0)
		return;
	for (; *s && n + 7 < size; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			out[n++] = '\\';
			out[n++] = (char)c;
		} else if (c < 0x20) {
			n += (size_t)snprintf(out + n, size - n, "\\u%04x", c);
		} else {
			out[n++] = (char)c;
		}
	}
	out[n] = '\0';
}

static void put_key(struct hist *h, const char *name)
{
	puts_(h, ",\"");
	puts_(h, name);
	puts_(h, "\":");
}

void hist_begin(struct hist *h, const char *kind)
{
	h->len = 0;
	h->failed = false;
	puts_(h, "{\"k\":\"");
	puts_(h, kind);
	puts_(h, "\"");
}

void hist_str(struct hist *h, const char *name, const char *value)
{
	char esc[1024];

	put_key(h, name);
	if (!value) {
		puts_(h, "null");
		return;
	}
	hist_json_escape(esc, sizeof(esc), value);
	puts_(h, "\"");
	puts_(h, esc);
	puts_(h, "\"");
}

void hist_int(struct hist *h, const char *name, int64_t value)
{
	char num[32];

	put_key(h, name);
	snprintf(num, sizeof(num), "%" PRId64, value);
	puts_(h, num);
}

void hist_bool(struct hist *h, const char *name, bool value)
{
	put_key(h, name);
	puts_(h, value ? "true" : "false");
}

void hist_raw(struct hist *h, const char *name, const char *json)
{
	put_key(h, name);
	puts_(h, json);
}

void hist_end(struct hist *h)
{
	puts_(h, "}\n");
	if (!h->failed && h->f)
		fwrite(h->buf, 1, h->len, h->f);
	h->len = 0;
}
