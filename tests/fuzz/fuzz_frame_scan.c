/*
 * fuzz_frame_scan.c — libFuzzer target for pgc_frame_scan, the scanner that
 * decides how many bytes of a client's stream form one message before
 * anything is decoded.
 *
 * Each input is scanned under several size and depth limits and every
 * answer is checked against an independent reference: a recursive walk
 * that measures the visible bytes without any limits (how far the object
 * provably extends, how deep it nests, whether a type byte is invalid).
 * A frame the scanner accepts must also decode with msgpack-c to exactly
 * the same length, and every proper prefix of it must be "need more".
 * The resumable pgc_scanner must agree with the one-shot scan when the same
 * bytes arrive in two reads, split where the input's last byte says, and
 * when they arrive one byte per read.
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

/* Deeper than any limit tried below; the reference stops walking there. */
#define REF_NEST_CAP 300

struct ref {
	const uint8_t *p;
	size_t len;
	uint64_t pos;	   /* bytes the object provably spans so far */
	uint64_t owed;	   /* objects still to come, at least one byte each */
	unsigned max_nest; /* deepest container whose header was visible */
	bool malformed;	   /* a 0xc1 where a type byte was due */
	bool stopped;	   /* ran out of bytes (or hit 0xc1, or the cap) */
};

static uint64_t ref_be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	while (n--)
		v = v << 8 | *p++;
	return v;
}

/* Header layout of a type byte, written from the MessagePack spec's table
 * rather than from codec.c's switch. */
static void ref_header(uint8_t b, unsigned *size, unsigned *len_bytes, int *kind, uint64_t *n)
{
	/* kind: 0 scalar, 1 blob, 2 array, 3 map */
	*size = 1, *len_bytes = 0, *kind = 0, *n = 0;
	if ((b & 0xf0) == 0x80)
		*kind = 3, *n = b & 0x0f;
	else if ((b & 0xf0) == 0x90)
		*kind = 2, *n = b & 0x0f;
	else if ((b & 0xe0) == 0xa0)
		*kind = 1, *n = b & 0x1f;
	else if (b >= 0xc4 && b <= 0xc6)
		*kind = 1, *len_bytes = 1u << (b - 0xc4);
	else if (b >= 0xd9 && b <= 0xdb)
		*kind = 1, *len_bytes = 1u << (b - 0xd9);
	else if (b >= 0xc7 && b <= 0xc9) /* ext: length, then a type byte */
		*kind = 1, *len_bytes = 1u << (b - 0xc7), *size = 2;
	else if (b == 0xca || b == 0xcb)
		*size = b == 0xca ? 5 : 9;
	else if (b >= 0xcc && b <= 0xcf)
		*size = 1 + (1u << (b - 0xcc));
	else if (b >= 0xd0 && b <= 0xd3)
		*size = 1 + (1u << (b - 0xd0));
	else if (b >= 0xd4 && b <= 0xd8) /* fixext: type byte + 1..16 bytes */
		*size = 2 + (1u << (b - 0xd4));
	else if (b == 0xdc || b == 0xdd)
		*kind = 2, *len_bytes = b == 0xdc ? 2 : 4;
	else if (b == 0xde || b == 0xdf)
		*kind = 3, *len_bytes = b == 0xde ? 2 : 4;
	*size += *len_bytes;
}

/* Walks one object (already counted in r->owed) at nesting `nest`. */
static void ref_object(struct ref *r, unsigned nest)
{
	unsigned size, len_bytes;
	int kind;
	uint64_t n;

	if (r->stopped)
		return;
	if (r->pos >= r->len) {
		r->stopped = true;
		return;
	}
	if (r->p[r->pos] == 0xc1) {
		r->malformed = r->stopped = true;
		return;
	}
	ref_header(r->p[r->pos], &size, &len_bytes, &kind, &n);
	r->owed--;
	r->pos += size;
	if (r->pos > r->len) {
		r->stopped = true;
		return;
	}
	if (len_bytes)
		n = ref_be(r->p + r->pos - size + 1, len_bytes);
	if (kind == 1) {
		r->pos += n;
		if (r->pos > r->len)
			r->stopped = true;
		return;
	}
	if (kind == 0)
		return;
	if (nest + 1 > r->max_nest)
		r->max_nest = nest + 1;
	if (nest + 1 >= REF_NEST_CAP) {
		r->stopped = true;
		return;
	}
	if (kind == 3)
		n *= 2;
	r->owed += n;
	for (uint64_t i = 0; i < n && !r->stopped; i++)
		ref_object(r, nest + 1);
}

static void fail(const char *what, size_t len, size_t max_size, unsigned max_depth,
		 enum pgc_scan_result got, const struct ref *r)
{
	fprintf(stderr,
		"frame scan: %s (len %zu, max_size %zu, max_depth %u: scanner said %s; "
		"reference: spans >= %llu, nests %u, %s%s)\n",
		what, len, max_size, max_depth, pgc_scan_result_name(got),
		(unsigned long long)(r->pos + r->owed), r->max_nest,
		r->stopped ? "incomplete" : "complete", r->malformed ? ", malformed" : "");
	abort();
}

static void check_decodes(const uint8_t *data, size_t frame_len)
{
	msgpack_unpacked u;
	size_t off = 0;

	msgpack_unpacked_init(&u);
	msgpack_unpack_return rc = msgpack_unpack_next(&u, (const char *)data, frame_len, &off);
	if (rc != MSGPACK_UNPACK_SUCCESS || off != frame_len) {
		fprintf(stderr,
			"frame scan: an accepted frame of %zu bytes does not decode "
			"(msgpack_unpack_next: %d, off %zu)\n",
			frame_len, (int)rc, off);
		abort();
	}
	msgpack_unpacked_destroy(&u);
}

static void resume_fail(const char *what, size_t len, size_t k, size_t max_size, unsigned max_depth,
			enum pgc_scan_result got, enum pgc_scan_result want)
{
	fprintf(stderr,
		"frame scan: resumable scanner %s (len %zu, split at %zu, max_size %zu, "
		"max_depth %u: scanner said %s, one-shot scan %s)\n",
		what, len, k, max_size, max_depth, pgc_scan_result_name(got),
		pgc_scan_result_name(want));
	abort();
}

/* Feeds data[0..k) and then data[0..len); the answers must be the one-shot
 * scan's for the same bytes, and an error must stay put. */
static void check_resumed(const uint8_t *data, size_t len, size_t k, size_t max_size,
			  unsigned max_depth, enum pgc_scan_result want, size_t want_len)
{
	struct pgc_scanner s;
	size_t frame_len = 0, prefix_len = 0;
	enum pgc_scan_result prefix = pgc_frame_scan(data, k, max_size, max_depth, &prefix_len);
	enum pgc_scan_result r;

	pgc_scanner_init(&s, max_size, max_depth, SIZE_MAX);
	r = pgc_scanner_feed(&s, data, k, &frame_len);
	if (r != prefix || (r == PGC_SCAN_COMPLETE && frame_len != prefix_len))
		resume_fail("differs on the first read", len, k, max_size, max_depth, r, prefix);
	if (r == PGC_SCAN_COMPLETE)
		return; /* reset for the next frame; the rest is another frame */
	frame_len = 0;
	enum pgc_scan_result again = pgc_scanner_feed(&s, data, len, &frame_len);
	if (r != PGC_SCAN_NEED_MORE) {
		if (again != r)
			resume_fail("forgot its error", len, k, max_size, max_depth, again, r);
		return;
	}
	if (again != want || (again == PGC_SCAN_COMPLETE && frame_len != want_len))
		resume_fail("differs once the rest arrived", len, k, max_size, max_depth, again,
			    want);
}

/* One byte per read, as a dribbling client sends. */
static void check_dribbled(const uint8_t *data, size_t len, size_t max_size, unsigned max_depth,
			   enum pgc_scan_result want, size_t want_len)
{
	struct pgc_scanner s;
	size_t frame_len = 0;
	enum pgc_scan_result r = PGC_SCAN_NEED_MORE;
	size_t k;

	pgc_scanner_init(&s, max_size, max_depth, SIZE_MAX);
	for (k = 1; k <= len && r == PGC_SCAN_NEED_MORE; k++)
		r = pgc_scanner_feed(&s, data, k, &frame_len);
	if (r != want || (r == PGC_SCAN_COMPLETE && frame_len != want_len))
		resume_fail("differs fed a byte at a time", len, k - 1, max_size, max_depth, r,
			    want);
}

static void check_one(const uint8_t *data, size_t len, size_t max_size, unsigned max_depth)
{
	struct ref r = {.p = data, .len = len, .owed = 1};
	size_t frame_len = 0;
	enum pgc_scan_result got = pgc_frame_scan(data, len, max_size, max_depth, &frame_len);

	ref_object(&r, 0);
	uint64_t spans = r.pos + r.owed;
	bool too_big = spans > max_size;
	bool too_deep = r.max_nest > max_depth;
	bool complete = !r.stopped;

	switch (got) {
	case PGC_SCAN_COMPLETE:
		if (!complete || too_big || too_deep || r.malformed)
			fail("accepted a frame the reference refuses", len, max_size, max_depth,
			     got, &r);
		if (frame_len != r.pos)
			fail("frame length differs from the reference", len, max_size, max_depth,
			     got, &r);
		check_decodes(data, frame_len);
		/* the same bytes arriving in pieces: every prefix is incomplete */
		for (size_t k = frame_len / 2; k < frame_len; k += (frame_len - k + 1) / 2) {
			size_t ignored;
			enum pgc_scan_result p =
			    pgc_frame_scan(data, k, max_size, max_depth, &ignored);
			if (p != PGC_SCAN_NEED_MORE)
				fail("a proper prefix of an accepted frame was not need_more", k,
				     max_size, max_depth, p, &r);
		}
		break;
	case PGC_SCAN_NEED_MORE:
		if (complete || too_big || too_deep || r.malformed)
			fail("asked for more where the reference decides", len, max_size, max_depth,
			     got, &r);
		if (len > max_size)
			fail("asked for more past max_size", len, max_size, max_depth, got, &r);
		break;
	case PGC_SCAN_TOO_BIG:
		if (!too_big)
			fail("too_big for an object that fits", len, max_size, max_depth, got, &r);
		break;
	case PGC_SCAN_TOO_DEEP:
		if (!too_deep)
			fail("too_deep for an object within the depth", len, max_size, max_depth,
			     got, &r);
		break;
	case PGC_SCAN_MALFORMED:
		if (!r.malformed)
			fail("malformed without a 0xc1 type byte", len, max_size, max_depth, got,
			     &r);
		break;
	default:
		fail("an unknown result", len, max_size, max_depth, got, &r);
	}
	if (len > 0) {
		check_resumed(data, len, 1 + (size_t)data[len - 1] * 257 % len, max_size, max_depth,
			      got, frame_len);
		check_dribbled(data, len, max_size, max_depth, got, frame_len);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The agent's defaults, then limits around the input's own size and
	 * shallow depths, where the boundary cases live. msgpack-c decodes at
	 * most 32 levels, so no limit here goes past that. */
	static const unsigned depths[] = {PGC_DEFAULT_MAX_DEPTH, 4, 1};

	check_one(data, size, PGC_DEFAULT_MAX_MESSAGE, PGC_DEFAULT_MAX_DEPTH);
	for (size_t i = 0; i < sizeof(depths) / sizeof(depths[0]); i++) {
		check_one(data, size, size, depths[i]);
		check_one(data, size, size / 2 + 1, depths[i]);
	}
	check_one(data, size, 0, 0);
	return 0;
}
