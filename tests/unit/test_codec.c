/*
 * test_codec.c — pins proto/codec.c: where the frame scanner says an object
 * ends and when it refuses one, the envelope checks, typed reads and writes,
 * and the error table of PROTOCOL.md.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"

#define MIB (1024 * 1024)

struct encoding {
	const char *name;
	const uint8_t *bytes;
	size_t len;
};

#define ENC(name, ...)                                                                             \
	{                                                                                          \
		name, (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})       \
	}

/* One valid encoding of every MessagePack format, widest forms included. */
static const struct encoding all_formats[] = {
    ENC("nil", 0xc0),
    ENC("false", 0xc2),
    ENC("true", 0xc3),
    ENC("positive fixint 0", 0x00),
    ENC("positive fixint 127", 0x7f),
    ENC("negative fixint -32", 0xe0),
    ENC("negative fixint -1", 0xff),
    ENC("uint8", 0xcc, 0xff),
    ENC("uint16", 0xcd, 0x01, 0x00),
    ENC("uint32", 0xce, 0x01, 0x02, 0x03, 0x04),
    ENC("uint64", 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
    ENC("int8", 0xd0, 0x80),
    ENC("int16", 0xd1, 0x80, 0x00),
    ENC("int32", 0xd2, 0x80, 0x00, 0x00, 0x00),
    ENC("int64", 0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00),
    ENC("float32", 0xca, 0x3f, 0x80, 0x00, 0x00),
    ENC("float64", 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00),
    ENC("fixstr empty", 0xa0),
    ENC("fixstr", 0xa3, 'a', 'b', 'c'),
    ENC("fixstr 31", 0xbf, 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a',
	'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'),
    ENC("str8", 0xd9, 0x03, 'a', 'b', 'c'),
    ENC("str8 empty", 0xd9, 0x00),
    ENC("str16", 0xda, 0x00, 0x03, 'a', 'b', 'c'),
    ENC("str32", 0xdb, 0x00, 0x00, 0x00, 0x03, 'a', 'b', 'c'),
    ENC("bin8", 0xc4, 0x02, 0xc1, 0x00),
    ENC("bin16", 0xc5, 0x00, 0x02, 0xc1, 0x00),
    ENC("bin32", 0xc6, 0x00, 0x00, 0x00, 0x02, 0xc1, 0x00),
    ENC("bin32 empty", 0xc6, 0x00, 0x00, 0x00, 0x00),
    ENC("fixext1", 0xd4, 0x01, 0xaa),
    ENC("fixext2", 0xd5, 0x01, 0xaa, 0xbb),
    ENC("fixext4", 0xd6, 0x01, 0xaa, 0xbb, 0xcc, 0xdd),
    ENC("fixext8", 0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8),
    ENC("fixext16", 0xd8, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
    ENC("ext8", 0xc7, 0x02, 0x05, 0xaa, 0xbb),
    ENC("ext8 empty", 0xc7, 0x00, 0x05),
    ENC("ext16", 0xc8, 0x00, 0x02, 0x05, 0xaa, 0xbb),
    ENC("ext32", 0xc9, 0x00, 0x00, 0x00, 0x02, 0x05, 0xaa, 0xbb),
    ENC("fixarray empty", 0x90),
    ENC("fixarray", 0x92, 0x01, 0xa1, 'x'),
    ENC("array16", 0xdc, 0x00, 0x02, 0x01, 0x02),
    ENC("array16 empty", 0xdc, 0x00, 0x00),
    ENC("array32", 0xdd, 0x00, 0x00, 0x00, 0x02, 0x01, 0xc0),
    ENC("fixmap empty", 0x80),
    ENC("fixmap", 0x81, 0xa1, 'k', 0x01),
    ENC("map16", 0xde, 0x00, 0x01, 0xa1, 'k', 0xc3),
    ENC("map32", 0xdf, 0x00, 0x00, 0x00, 0x01, 0x01, 0x90),
    ENC("nested", 0x93, 0x91, 0x80, 0x81, 0xa1, 'x', 0x92, 0xc0, 0xcd, 0x01, 0x00, 0x90),
    ENC("request", 0x94, 0x00, 0x07, 0xaa, 'a', 'g', 'e', 'n', 't', '.', 'p', 'i', 'n', 'g', 0x91,
	0x80),
};

#define N_FORMATS (sizeof(all_formats) / sizeof(all_formats[0]))

/* Scans a private heap copy of exactly len bytes, so ASan catches any
 * read past the end the scanner should not make. */
static enum pgc_scan_result scan_exact(const uint8_t *bytes, size_t len, size_t max_size,
				       unsigned max_depth, size_t *frame_len)
{
	uint8_t *copy = len > 0 ? malloc(len) : NULL;
	if (len > 0) {
		cr_assert_not_null(copy);
		memcpy(copy, bytes, len);
	}
	enum pgc_scan_result r = pgc_frame_scan(copy, len, max_size, max_depth, frame_len);
	free(copy);
	return r;
}

Test(frame_scan, every_proper_prefix_needs_more_and_the_whole_is_complete)
{
	for (size_t i = 0; i < N_FORMATS; i++) {
		const struct encoding *e = &all_formats[i];
		size_t fl = 0;

		for (size_t k = 0; k < e->len; k++) {
			enum pgc_scan_result r = scan_exact(e->bytes, k, MIB, 32, &fl);
			cr_assert_eq(r, PGC_SCAN_NEED_MORE, "%s: prefix of %zu/%zu bytes gave %s",
				     e->name, k, e->len, pgc_scan_result_name(r));
		}
		fl = 0;
		enum pgc_scan_result r = scan_exact(e->bytes, e->len, MIB, 32, &fl);
		cr_assert_eq(r, PGC_SCAN_COMPLETE, "%s: whole gave %s", e->name,
			     pgc_scan_result_name(r));
		cr_assert_eq(fl, e->len, "%s: frame_len %zu, want %zu", e->name, fl, e->len);
	}
}

Test(frame_scan, trailing_bytes_are_not_part_of_the_frame)
{
	for (size_t i = 0; i < N_FORMATS; i++) {
		const struct encoding *e = &all_formats[i];
		uint8_t buf[64];
		size_t fl = 0;

		cr_assert_leq(e->len + 3, sizeof(buf));
		memcpy(buf, e->bytes, e->len);
		/* The next object may be malformed; that is its reader's problem. */
		buf[e->len] = 0xc1;
		buf[e->len + 1] = 0xdb;
		buf[e->len + 2] = 0xff;
		cr_assert_eq(scan_exact(buf, e->len + 3, MIB, 32, &fl), PGC_SCAN_COMPLETE, "%s",
			     e->name);
		cr_assert_eq(fl, e->len, "%s", e->name);
	}
}

Test(frame_scan, max_size_is_inclusive)
{
	for (size_t i = 0; i < N_FORMATS; i++) {
		const struct encoding *e = &all_formats[i];
		size_t fl = 0;

		cr_assert_eq(scan_exact(e->bytes, e->len, e->len, 32, &fl), PGC_SCAN_COMPLETE,
			     "%s at max_size == its length", e->name);
		cr_assert_eq(fl, e->len);
		enum pgc_scan_result r = scan_exact(e->bytes, e->len, e->len - 1, 32, &fl);
		cr_assert_eq(r, PGC_SCAN_TOO_BIG, "%s at max_size == length - 1 gave %s", e->name,
			     pgc_scan_result_name(r));
		/* No prefix may look complete when the whole cannot fit. */
		for (size_t k = 0; k < e->len; k++) {
			r = scan_exact(e->bytes, k, e->len - 1, 32, &fl);
			cr_assert(r == PGC_SCAN_NEED_MORE || r == PGC_SCAN_TOO_BIG,
				  "%s prefix %zu gave %s", e->name, k, pgc_scan_result_name(r));
		}
	}
}

Test(frame_scan, empty_buffer_needs_more)
{
	size_t fl = 0;

	cr_assert_eq(pgc_frame_scan(NULL, 0, MIB, 32, &fl), PGC_SCAN_NEED_MORE);
}

Test(frame_scan, oversize_str32_is_too_big_from_its_header_alone)
{
	const uint8_t huge[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
	const uint8_t two_mib[] = {0xdb, 0x00, 0x20, 0x00, 0x00};
	size_t fl = 0;

	cr_assert_eq(scan_exact(huge, sizeof(huge), MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(two_mib, sizeof(two_mib), MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	/* With a 4-byte length still incomplete, the scanner must wait. */
	cr_assert_eq(scan_exact(huge, 4, MIB, 32, &fl), PGC_SCAN_NEED_MORE);
}

Test(frame_scan, blob_length_boundary_is_exact)
{
	/* A 5-byte str32 header plus (max - 5) bytes fits; one more does not. */
	uint8_t hdr[5] = {0xdb};
	uint32_t fits = MIB - 5;
	size_t fl = 0;

	hdr[1] = fits >> 24;
	hdr[2] = fits >> 16;
	hdr[3] = fits >> 8;
	hdr[4] = fits;
	cr_assert_eq(scan_exact(hdr, 5, MIB, 32, &fl), PGC_SCAN_NEED_MORE);
	hdr[4] = fits + 1;
	cr_assert_eq(scan_exact(hdr, 5, MIB, 32, &fl), PGC_SCAN_TOO_BIG);

	/* Inside an array, the siblings still owed count against the budget. */
	const uint8_t in_array[] = {0x92, 0xd9, 0x05};
	cr_assert_eq(scan_exact(in_array, 3, 1 + 2 + 5 + 1, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(in_array, 3, 1 + 2 + 5, 32, &fl), PGC_SCAN_TOO_BIG);

	/* bin32 and ext32 lengths are checked the same way. */
	const uint8_t bin[] = {0xc6, 0xff, 0xff, 0xff, 0xfb};
	const uint8_t ext[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
	cr_assert_eq(scan_exact(bin, sizeof(bin), MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(ext, sizeof(ext), MIB, 32, &fl), PGC_SCAN_TOO_BIG);
}

Test(frame_scan, fixed_size_header_larger_than_max_is_too_big_before_it_arrives)
{
	const uint8_t fixext16[] = {0xd8};
	const uint8_t uint64[] = {0xcf};
	size_t fl = 0;

	cr_assert_eq(scan_exact(fixext16, 1, 17, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(fixext16, 1, 18, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(uint64, 1, 8, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(uint64, 1, 9, 32, &fl), PGC_SCAN_NEED_MORE);
}

Test(frame_scan, huge_array_or_map_count_is_too_big_at_once)
{
	const uint8_t array32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
	const uint8_t map32_half[] = {0xdf, 0x00, 0x08, 0x00, 0x00}; /* 2^19 pairs = 1 MiB */
	size_t fl = 0;

	cr_assert_eq(scan_exact(array32, 5, MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(map32, 5, MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	/* 2 * count elements, not count, must fit. */
	cr_assert_eq(scan_exact(map32_half, 5, MIB, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(map32_half, 5, 5 + MIB, 32, &fl), PGC_SCAN_NEED_MORE);
}

Test(frame_scan, container_count_boundary_is_exact)
{
	const uint8_t array16[] = {0xdc, 0x00, 0x40}; /* 64 elements */
	const uint8_t map16[] = {0xde, 0x00, 0x20};   /* 32 pairs = 64 elements */
	size_t fl = 0;

	cr_assert_eq(scan_exact(array16, 3, 3 + 64, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(array16, 3, 3 + 63, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(map16, 3, 3 + 64, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(map16, 3, 3 + 63, 32, &fl), PGC_SCAN_TOO_BIG);

	/* [[64 elements], x]: the outer sibling still owed counts too. */
	const uint8_t nested[] = {0x92, 0xdc, 0x00, 0x40};
	cr_assert_eq(scan_exact(nested, 4, 1 + 3 + 64 + 1, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(nested, 4, 1 + 3 + 64, 32, &fl), PGC_SCAN_TOO_BIG);
}

Test(frame_scan, buffer_longer_than_max_without_a_frame_is_too_big)
{
	/* [ "ab", "c" ] is 6 bytes; with max 4 and all of it present. */
	const uint8_t buf[] = {0x92, 0xa2, 'a', 'b', 0xa1, 'c'};
	size_t fl = 0;

	cr_assert_eq(scan_exact(buf, sizeof(buf), 4, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(buf, sizeof(buf), 5, 32, &fl), PGC_SCAN_TOO_BIG);
	cr_assert_eq(scan_exact(buf, sizeof(buf), 6, 32, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, 6);

	/* A long run of scalars inside one big array. */
	uint8_t run[300];
	run[0] = 0xdc;
	run[1] = 0x01;
	run[2] = 0x00; /* 256 elements */
	memset(run + 3, 0xcc, sizeof(run) - 3);
	cr_assert_eq(scan_exact(run, sizeof(run), 200, 32, &fl), PGC_SCAN_TOO_BIG);
}

Test(frame_scan, max_size_at_size_max_does_not_wrap)
{
	const uint8_t array32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
	const uint8_t ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
	const uint8_t in_array[] = {0x92, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'};
	size_t fl = 0;

	cr_assert_eq(scan_exact(array32, 5, SIZE_MAX, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(map32, 5, SIZE_MAX, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(ext32, 6, SIZE_MAX, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(in_array, 7, SIZE_MAX, 32, &fl), PGC_SCAN_NEED_MORE);
}

Test(frame_scan, max_size_zero_refuses_everything)
{
	const uint8_t nil[] = {0xc0};
	size_t fl = 0;

	cr_assert_eq(scan_exact(nil, 1, 0, 32, &fl), PGC_SCAN_TOO_BIG);
}

/* depth nested one-element arrays around a nil, or around [] when empty_core. */
static size_t build_nested(uint8_t *buf, unsigned depth, uint8_t container, bool empty_core)
{
	size_t n = 0;

	for (unsigned i = 0; i < depth; i++) {
		if (empty_core && i == depth - 1) {
			buf[n++] = container & 0xf0; /* 0x90 or 0x80 */
			return n;
		}
		buf[n++] = container;
		if (container == 0x81)
			buf[n++] = 0x01; /* key */
	}
	buf[n++] = 0xc0;
	return n;
}

Test(frame_scan, depth_limit_boundary_is_exact)
{
	static const uint8_t containers[] = {0x91, 0x81};
	uint8_t buf[2 * 64 + 1];
	size_t fl = 0;

	for (unsigned c = 0; c < 2; c++) {
		for (unsigned max = 1; max <= 40; max++) {
			for (int empty = 0; empty <= 1; empty++) {
				size_t n = build_nested(buf, max, containers[c], empty);
				cr_assert_eq(scan_exact(buf, n, MIB, max, &fl), PGC_SCAN_COMPLETE,
					     "%u levels of 0x%02x (empty core %d), max_depth %u",
					     max, containers[c], empty, max);
				cr_assert_eq(fl, n);

				n = build_nested(buf, max + 1, containers[c], empty);
				cr_assert_eq(scan_exact(buf, n, MIB, max, &fl), PGC_SCAN_TOO_DEEP,
					     "%u levels of 0x%02x (empty core %d), max_depth %u",
					     max + 1, containers[c], empty, max);
			}
		}
	}
}

Test(frame_scan, too_deep_is_reported_before_the_object_completes)
{
	uint8_t buf[33];
	size_t fl = 0;

	memset(buf, 0x91, sizeof(buf));
	cr_assert_eq(scan_exact(buf, 32, MIB, 32, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(scan_exact(buf, 33, MIB, 32, &fl), PGC_SCAN_TOO_DEEP);
}

Test(frame_scan, depth_counts_nesting_not_siblings)
{
	/* [[], [[]], {1: []}, [[]]] at max_depth 3. */
	const uint8_t siblings[] = {0x94, 0x90, 0x91, 0x90, 0x81, 0x01, 0x90, 0x91, 0x90};
	/* [[[nil]], [[nil]]]: the second branch returns to depth 3 after popping. */
	const uint8_t branches[] = {0x92, 0x91, 0x91, 0xc0, 0x91, 0x91, 0xc0};
	size_t fl = 0;

	cr_assert_eq(scan_exact(siblings, sizeof(siblings), MIB, 3, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, sizeof(siblings));
	cr_assert_eq(scan_exact(siblings, sizeof(siblings), MIB, 2, &fl), PGC_SCAN_TOO_DEEP);
	cr_assert_eq(scan_exact(branches, sizeof(branches), MIB, 3, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, sizeof(branches));
	cr_assert_eq(scan_exact(branches, sizeof(branches), MIB, 2, &fl), PGC_SCAN_TOO_DEEP);
}

Test(frame_scan, max_depth_zero_allows_only_scalars)
{
	const uint8_t scalar[] = {0x2a};
	const uint8_t empty_array[] = {0x90};
	size_t fl = 0;

	cr_assert_eq(scan_exact(scalar, 1, MIB, 0, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(scan_exact(empty_array, 1, MIB, 0, &fl), PGC_SCAN_TOO_DEEP);
}

Test(frame_scan, very_deep_input_with_huge_max_depth_is_refused_not_crashed)
{
	size_t n = 100000;
	uint8_t *buf = malloc(n);
	size_t fl = 0;

	cr_assert_not_null(buf);
	memset(buf, 0x91, n);
	cr_assert_eq(pgc_frame_scan(buf, n, 10 * MIB, UINT32_MAX, &fl), PGC_SCAN_TOO_DEEP);
	/* Well under the internal ceiling, a large max_depth is honoured. */
	n = build_nested(buf, 200, 0x91, false);
	cr_assert_eq(pgc_frame_scan(buf, n, MIB, 200, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, n);
	free(buf);
}

Test(frame_scan, byte_c1_is_malformed)
{
	const uint8_t alone[] = {0xc1};
	const uint8_t in_array[] = {0x92, 0x01, 0xc1};
	const uint8_t as_map_value[] = {0x81, 0xa1, 'k', 0xc1};
	const uint8_t inside_str[] = {0xa1, 0xc1};
	size_t fl = 0;

	cr_assert_eq(scan_exact(alone, 1, MIB, 32, &fl), PGC_SCAN_MALFORMED);
	cr_assert_eq(scan_exact(in_array, 3, MIB, 32, &fl), PGC_SCAN_MALFORMED);
	cr_assert_eq(scan_exact(as_map_value, 4, MIB, 32, &fl), PGC_SCAN_MALFORMED);
	/* Payload bytes are data, not type bytes. */
	cr_assert_eq(scan_exact(inside_str, 2, MIB, 32, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, 2);
}

Test(frame_scan, result_names)
{
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_NEED_MORE), "need_more");
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_COMPLETE), "complete");
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_TOO_BIG), "too_big");
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_TOO_DEEP), "too_deep");
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_MALFORMED), "malformed");
	cr_assert_str_eq(pgc_scan_result_name(PGC_SCAN_TOO_MANY), "too_many");
	cr_assert_str_eq(pgc_scan_result_name((enum pgc_scan_result)99), "unknown");
}

/* --- randomized --- */

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	/* xorshift64*: deterministic, so a failure reproduces. */
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 2685821657736338717ULL;
}

static unsigned rng_below(struct rng *r, unsigned n)
{
	return (unsigned)(rng_next(r) % n);
}

struct bytes {
	uint8_t buf[16384];
	size_t len;
};

static void put(struct bytes *b, uint8_t v)
{
	cr_assert_lt(b->len, sizeof(b->buf), "generator outgrew its buffer");
	b->buf[b->len++] = v;
}

static void put_be(struct bytes *b, uint64_t v, unsigned width)
{
	for (unsigned i = width; i > 0; i--)
		put(b, (uint8_t)(v >> (8 * (i - 1))));
}

/* A length/count header in a randomly chosen width that can hold n. */
static void put_len_header(struct rng *r, struct bytes *b, unsigned n, uint8_t fix,
			   unsigned fix_max, uint8_t w8, uint8_t w16, uint8_t w32)
{
	for (;;) {
		switch (rng_below(r, 4)) {
		case 0:
			if (fix != 0 && n <= fix_max) {
				put(b, fix | (uint8_t)n);
				return;
			}
			break;
		case 1:
			if (w8 != 0 && n <= 0xff) {
				put(b, w8);
				put_be(b, n, 1);
				return;
			}
			break;
		case 2:
			if (n <= 0xffff) {
				put(b, w16);
				put_be(b, n, 2);
				return;
			}
			break;
		default:
			put(b, w32);
			put_be(b, n, 4);
			return;
		}
	}
}

/* Writes one random valid object using every encoding width; returns its depth. */
static unsigned gen_object(struct rng *r, struct bytes *b, unsigned depth_left)
{
	unsigned kind = rng_below(r, depth_left > 0 ? 12 : 9);
	unsigned n, deepest = 0;

	switch (kind) {
	case 0:
		put(b, (uint8_t[]){0xc0, 0xc2, 0xc3}[rng_below(r, 3)]);
		return 0;
	case 1:
		if (rng_below(r, 2))
			put(b, (uint8_t)rng_below(r, 0x80)); /* positive fixint */
		else
			put(b, (uint8_t)(0xe0 | rng_below(r, 0x20))); /* negative fixint */
		return 0;
	case 2: {
		static const uint8_t ints[] = {0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3};
		uint8_t t = ints[rng_below(r, 8)];
		put(b, t);
		put_be(b, rng_next(r), 1u << (t & 0x03));
		return 0;
	}
	case 3:
		if (rng_below(r, 2)) {
			put(b, 0xca);
			put_be(b, 0x3fc00000, 4);
		} else {
			put(b, 0xcb);
			put_be(b, rng_next(r), 8);
		}
		return 0;
	case 4:
	case 5:
		n = rng_below(r, 40);
		if (kind == 4)
			put_len_header(r, b, n, 0xa0, 31, 0xd9, 0xda, 0xdb);
		else
			put_len_header(r, b, n, 0, 0, 0xc4, 0xc5, 0xc6);
		for (unsigned i = 0; i < n; i++)
			put(b, (uint8_t)rng_next(r));
		return 0;
	case 6: {
		static const unsigned fixlen[] = {1, 2, 4, 8, 16};
		unsigned f = rng_below(r, 5);
		put(b, (uint8_t)(0xd4 + f));
		put(b, (uint8_t)rng_next(r)); /* ext type */
		for (unsigned i = 0; i < fixlen[f]; i++)
			put(b, (uint8_t)rng_next(r));
		return 0;
	}
	case 7:
	case 8:
		n = rng_below(r, 20);
		put_len_header(r, b, n, 0, 0, 0xc7, 0xc8, 0xc9);
		put(b, (uint8_t)rng_next(r));
		for (unsigned i = 0; i < n; i++)
			put(b, (uint8_t)rng_next(r));
		return 0;
	case 9:
	case 10:
		n = rng_below(r, 4);
		put_len_header(r, b, n, 0x90, 15, 0, 0xdc, 0xdd);
		for (unsigned i = 0; i < n; i++) {
			unsigned d = gen_object(r, b, depth_left - 1);
			deepest = d > deepest ? d : deepest;
		}
		return deepest + 1;
	default:
		n = rng_below(r, 3);
		put_len_header(r, b, n, 0x80, 15, 0, 0xde, 0xdf);
		for (unsigned i = 0; i < 2 * n; i++) {
			unsigned d = gen_object(r, b, depth_left - 1);
			deepest = d > deepest ? d : deepest;
		}
		return deepest + 1;
	}
}

/* Bytes that steer random input towards headers the scanner must reason about. */
static uint8_t interesting_byte(struct rng *r)
{
	static const uint8_t pool[] = {0x00, 0x01, 0x7f, 0x80, 0x81, 0x8f, 0x90, 0x91, 0x9f,
				       0xa0, 0xa5, 0xbf, 0xc0, 0xc1, 0xc2, 0xc4, 0xc5, 0xc6,
				       0xc7, 0xc8, 0xc9, 0xca, 0xcb, 0xcf, 0xd3, 0xd4, 0xd8,
				       0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};
	if (rng_below(r, 3) == 0)
		return (uint8_t)rng_next(r);
	return pool[rng_below(r, sizeof(pool))];
}

static unsigned decoded_depth(const msgpack_object *o)
{
	unsigned deepest = 0, d;

	if (o->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			d = decoded_depth(&o->via.array.ptr[i]);
			deepest = d > deepest ? d : deepest;
		}
		return deepest + 1;
	}
	if (o->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			d = decoded_depth(&o->via.map.ptr[i].key);
			deepest = d > deepest ? d : deepest;
			d = decoded_depth(&o->via.map.ptr[i].val);
			deepest = d > deepest ? d : deepest;
		}
		return deepest + 1;
	}
	return 0;
}

/* What COMPLETE promises: msgpack-c decodes exactly frame_len bytes, within the limits. */
static void check_complete(const uint8_t *buf, size_t len, size_t max_size, unsigned max_depth,
			   size_t fl, uint64_t iter)
{
	cr_assert(fl > 0 && fl <= len && fl <= max_size,
		  "iter %llu: frame_len %zu, len %zu, max %zu", (unsigned long long)iter, fl, len,
		  max_size);

	msgpack_unpacked u;
	size_t off = 0;
	msgpack_unpacked_init(&u);
	msgpack_unpack_return ret = msgpack_unpack_next(&u, (const char *)buf, fl, &off);
	cr_assert_eq(ret, MSGPACK_UNPACK_SUCCESS, "iter %llu: msgpack-c says %d on %zu bytes",
		     (unsigned long long)iter, ret, fl);
	cr_assert_eq(off, fl, "iter %llu: msgpack-c consumed %zu of %zu", (unsigned long long)iter,
		     off, fl);
	cr_assert_leq(decoded_depth(&u.data), max_depth, "iter %llu", (unsigned long long)iter);
	msgpack_unpacked_destroy(&u);

	/* The frame alone, at the tightest limit, is the same frame. */
	size_t fl2 = 0;
	cr_assert_eq(pgc_frame_scan(buf, fl, fl, max_depth, &fl2), PGC_SCAN_COMPLETE, "iter %llu",
		     (unsigned long long)iter);
	cr_assert_eq(fl2, fl);
}

Test(frame_scan, random_input_never_crashes_and_complete_always_decodes)
{
	struct rng r = {0x9e3779b97f4a7c15ULL};
	struct bytes b;
	unsigned counts[PGC_SCAN_MALFORMED + 1] = {0};

	for (uint64_t iter = 0; iter < 20000; iter++) {
		unsigned gen_depth = 0;
		bool pristine = false;

		b.len = 0;
		if (rng_below(&r, 3) == 0) {
			size_t n = rng_below(&r, 48);
			for (size_t i = 0; i < n; i++)
				put(&b, interesting_byte(&r));
		} else {
			gen_depth = gen_object(&r, &b, rng_below(&r, 40));
			pristine = true;
			unsigned flips = rng_below(&r, 4);
			for (unsigned i = 0; i < flips && b.len > 0; i++) {
				b.buf[rng_below(&r, (unsigned)b.len)] = interesting_byte(&r);
				pristine = false;
			}
		}
		size_t whole = b.len;
		/* Sometimes cut short, sometimes followed by the next message's bytes. */
		if (rng_below(&r, 4) == 0 && b.len > 0) {
			b.len = rng_below(&r, (unsigned)b.len);
			pristine = false;
		} else if (rng_below(&r, 4) == 0) {
			for (unsigned i = rng_below(&r, 8); i > 0; i--)
				put(&b, interesting_byte(&r));
		}

		size_t max_size;
		switch (rng_below(&r, 3)) {
		case 0:
			max_size = 1 + rng_below(&r, 64);
			break;
		case 1:
			max_size = b.len;
			break;
		default:
			max_size = MIB;
			break;
		}
		/* msgpack-c's unpacker cannot go deeper than 32. */
		unsigned max_depth = rng_below(&r, 33);

		uint8_t *copy = malloc(b.len > 0 ? b.len : 1);
		cr_assert_not_null(copy);
		memcpy(copy, b.buf, b.len);
		size_t fl = 0;
		enum pgc_scan_result res = pgc_frame_scan(copy, b.len, max_size, max_depth, &fl);
		cr_assert_leq((unsigned)res, (unsigned)PGC_SCAN_MALFORMED);
		counts[res]++;

		if (res == PGC_SCAN_COMPLETE)
			check_complete(copy, b.len, max_size, max_depth, fl, iter);
		if (pristine && whole <= max_size) {
			/* A valid object within both limits must be found, whole. */
			enum pgc_scan_result want =
			    gen_depth > max_depth ? PGC_SCAN_TOO_DEEP : PGC_SCAN_COMPLETE;
			cr_assert_eq(res, want, "iter %llu: depth %u max %u gave %s",
				     (unsigned long long)iter, gen_depth, max_depth,
				     pgc_scan_result_name(res));
			if (res == PGC_SCAN_COMPLETE)
				cr_assert_eq(fl, whole, "iter %llu", (unsigned long long)iter);
		}
		if (pristine && whole > max_size)
			cr_assert_eq(res == PGC_SCAN_TOO_BIG || res == PGC_SCAN_TOO_DEEP, true,
				     "iter %llu: %zu-byte object, max %zu gave %s",
				     (unsigned long long)iter, whole, max_size,
				     pgc_scan_result_name(res));
		free(copy);
	}
	/* The generator must actually reach every outcome, or the test proves little. */
	for (unsigned i = 0; i <= PGC_SCAN_MALFORMED; i++)
		cr_assert_gt(counts[i], 100, "%s seen only %u times",
			     pgc_scan_result_name((enum pgc_scan_result)i), counts[i]);
}

/* --- resumable scanning --- */

/*
 * Feeds bytes[0..len) to a scanner the way a socket reader would, growing
 * the buffer by the given step sizes (cycled), each call on a private heap
 * copy of exactly the bytes received so far so ASan sees any read past them.
 * At every length the verdict must be what one-shot scanning of the same
 * prefix says. Returns the first verdict that is not NEED_MORE (or NEED_MORE).
 */
static enum pgc_scan_result feed_in_steps(const uint8_t *bytes, size_t len, size_t max_size,
					  unsigned max_depth, const size_t *steps, size_t nsteps,
					  size_t *frame_len)
{
	struct pgc_scanner s;
	enum pgc_scan_result r = PGC_SCAN_NEED_MORE;
	size_t have = 0, k = 0;

	pgc_scanner_init(&s, max_size, max_depth, SIZE_MAX);
	for (;;) {
		uint8_t *copy = malloc(have > 0 ? have : 1);
		size_t fl = 0, fl1 = 0;
		cr_assert_not_null(copy);
		memcpy(copy, bytes, have);
		r = pgc_scanner_feed(&s, copy, have, &fl);
		enum pgc_scan_result one = pgc_frame_scan(copy, have, max_size, max_depth, &fl1);
		free(copy);
		cr_assert_eq(r, one, "at %zu of %zu bytes: resumed %s, one-shot %s", have, len,
			     pgc_scan_result_name(r), pgc_scan_result_name(one));
		if (r == PGC_SCAN_COMPLETE) {
			cr_assert_eq(fl, fl1, "at %zu bytes", have);
			*frame_len = fl;
		}
		if (r != PGC_SCAN_NEED_MORE || have == len)
			return r;
		size_t step = steps[k++ % nsteps];
		have = step > len - have ? len : have + step;
	}
}

Test(scanner, every_split_point_of_every_format_gives_the_one_shot_verdict)
{
	for (size_t i = 0; i < N_FORMATS; i++) {
		const struct encoding *e = &all_formats[i];
		for (size_t cut = 0; cut <= e->len; cut++) {
			/* first `cut` bytes, then the rest in one go */
			size_t steps[2] = {cut, e->len};
			size_t fl = 0;
			cr_assert_eq(feed_in_steps(e->bytes, e->len, MIB, 32, steps, 2, &fl),
				     PGC_SCAN_COMPLETE, "%s cut at %zu", e->name, cut);
			cr_assert_eq(fl, e->len, "%s cut at %zu", e->name, cut);
		}
		size_t one = 1, fl = 0;
		cr_assert_eq(feed_in_steps(e->bytes, e->len, MIB, 32, &one, 1, &fl),
			     PGC_SCAN_COMPLETE, "%s byte by byte", e->name);
		cr_assert_eq(fl, e->len);
	}
}

Test(scanner, invalid_frames_split_anywhere_fail_alike)
{
	const struct encoding bad[] = {
	    ENC("c1 inside an array", 0x93, 0x01, 0xa2, 'x', 'y', 0xc1),
	    ENC("str32 over max", 0x92, 0x01, 0xdb, 0x00, 0x10, 0x00, 0x01, 'x'),
	    ENC("array32 over max", 0x91, 0xdd, 0x00, 0x10, 0x00, 0x00, 0x01),
	    ENC("too deep", 0x91, 0x91, 0x91, 0x91, 0x91, 0xc0),
	    ENC("blob spans the limit", 0x92, 0xc4, 0x20, 'a', 'a', 'a'),
	};
	static const enum pgc_scan_result want[] = {PGC_SCAN_MALFORMED, PGC_SCAN_TOO_BIG,
						    PGC_SCAN_TOO_BIG, PGC_SCAN_TOO_DEEP,
						    PGC_SCAN_TOO_BIG};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (size_t cut = 0; cut <= bad[i].len; cut++) {
			size_t steps[2] = {cut, bad[i].len}, fl = 0;
			cr_assert_eq(feed_in_steps(bad[i].bytes, bad[i].len, 32, 4, steps, 2, &fl),
				     want[i], "%s cut at %zu", bad[i].name, cut);
		}
	}
}

Test(scanner, random_input_in_random_steps_matches_one_shot)
{
	struct rng r = {0x2545f4914f6cdd1dULL};
	struct bytes b;

	for (uint64_t iter = 0; iter < 4000; iter++) {
		b.len = 0;
		gen_object(&r, &b, rng_below(&r, 40));
		for (unsigned i = rng_below(&r, 3); i > 0 && b.len > 0; i--)
			b.buf[rng_below(&r, (unsigned)b.len)] = interesting_byte(&r);
		size_t steps[3] = {1 + rng_below(&r, 4), 1 + rng_below(&r, 40), 1};
		size_t max_size = rng_below(&r, 2) ? MIB : 1 + rng_below(&r, 256);
		unsigned max_depth = rng_below(&r, 33);
		size_t fl = 0, fl1 = 0;
		enum pgc_scan_result res =
		    feed_in_steps(b.buf, b.len, max_size, max_depth, steps, 3, &fl);
		/* the verdict on the whole buffer is the one reached along the way */
		enum pgc_scan_result one = pgc_frame_scan(b.buf, b.len, max_size, max_depth, &fl1);
		cr_assert_eq(res, one, "iter %llu", (unsigned long long)iter);
		if (res == PGC_SCAN_COMPLETE)
			cr_assert_eq(fl, fl1, "iter %llu", (unsigned long long)iter);
	}
}

Test(scanner, resets_after_a_frame_and_scans_the_next)
{
	static const uint8_t two[] = {0x92, 0x01, 0xa1, 'x', 0x81, 0xa1, 'k', 0xc0};
	struct pgc_scanner s;
	size_t fl = 0;

	pgc_scanner_init(&s, MIB, 32, 100);
	cr_assert_eq(pgc_scanner_feed(&s, two, 2, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(pgc_scanner_feed(&s, two, sizeof(two), &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, 4);
	cr_assert_eq(pgc_scanner_feed(&s, two + 4, 1, &fl), PGC_SCAN_NEED_MORE);
	cr_assert_eq(pgc_scanner_feed(&s, two + 4, 4, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, 4);
}

Test(scanner, an_error_sticks_until_reset)
{
	static const uint8_t bad[] = {0x91, 0xc1};
	static const uint8_t good[] = {0xc0};
	struct pgc_scanner s;
	size_t fl = 0;

	pgc_scanner_init(&s, MIB, 32, 100);
	cr_assert_eq(pgc_scanner_feed(&s, bad, 2, &fl), PGC_SCAN_MALFORMED);
	cr_assert_eq(pgc_scanner_feed(&s, good, 1, &fl), PGC_SCAN_MALFORMED);
	pgc_scanner_reset(&s);
	cr_assert_eq(pgc_scanner_feed(&s, good, 1, &fl), PGC_SCAN_COMPLETE);
}

/* An array header declaring n elements, then n nils (n < 65536). */
static size_t nil_array(uint8_t *buf, unsigned n)
{
	buf[0] = 0xdc;
	buf[1] = (uint8_t)(n >> 8);
	buf[2] = (uint8_t)n;
	memset(buf + 3, 0xc0, n);
	return 3 + n;
}

Test(scanner, object_cap_counts_the_root_and_every_element_and_is_exact)
{
	static uint8_t buf[3 + 1000];
	size_t len = nil_array(buf, 1000), fl = 0;
	struct pgc_scanner s;

	pgc_scanner_init(&s, MIB, 32, 1001);
	cr_assert_eq(pgc_scanner_feed(&s, buf, len, &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, len);
	pgc_scanner_init(&s, MIB, 32, 1000);
	cr_assert_eq(pgc_scanner_feed(&s, buf, len, &fl), PGC_SCAN_TOO_MANY);
}

Test(scanner, object_cap_is_checked_at_the_header_before_the_elements_arrive)
{
	static uint8_t buf[3 + 1000];
	size_t fl = 0;
	struct pgc_scanner s;

	nil_array(buf, 1000);
	pgc_scanner_init(&s, MIB, 32, 500);
	/* only the 3-byte header: the declared count alone is over the cap */
	cr_assert_eq(pgc_scanner_feed(&s, buf, 3, &fl), PGC_SCAN_TOO_MANY);
}

Test(scanner, object_cap_counts_map_keys_and_values_and_nested_elements)
{
	/* {"a": [nil, nil], "b": nil}: root + 2 keys + 2 values + 2 elements = 7 */
	static const uint8_t m[] = {0x82, 0xa1, 'a', 0x92, 0xc0, 0xc0, 0xa1, 'b', 0xc0};
	struct pgc_scanner s;
	size_t fl = 0;

	pgc_scanner_init(&s, MIB, 32, 7);
	cr_assert_eq(pgc_scanner_feed(&s, m, sizeof(m), &fl), PGC_SCAN_COMPLETE);
	pgc_scanner_init(&s, MIB, 32, 6);
	cr_assert_eq(pgc_scanner_feed(&s, m, sizeof(m), &fl), PGC_SCAN_TOO_MANY);
	/* a cap of 0 refuses even a scalar; the count restarts with each frame */
	pgc_scanner_init(&s, MIB, 32, 0);
	cr_assert_eq(pgc_scanner_feed(&s, m + 8, 1, &fl), PGC_SCAN_TOO_MANY);
	pgc_scanner_init(&s, MIB, 32, 7);
	cr_assert_eq(pgc_scanner_feed(&s, m, sizeof(m), &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(pgc_scanner_feed(&s, m, sizeof(m), &fl), PGC_SCAN_COMPLETE);
}

Test(scanner, byte_by_byte_costs_a_bounded_number_of_examined_bytes)
{
	/* a 64 KiB str fed one byte at a time: pos reaches the end exactly once */
	static uint8_t buf[5 + 65536];
	struct pgc_scanner s;
	size_t fl = 0;

	buf[0] = 0xdb;
	buf[1] = 0;
	buf[2] = 1;
	buf[3] = 0;
	buf[4] = 0;
	memset(buf + 5, 'x', 65536);
	pgc_scanner_init(&s, MIB, 32, 10);
	for (size_t have = 1; have < sizeof(buf); have++) {
		cr_assert_eq(pgc_scanner_feed(&s, buf, have, &fl), PGC_SCAN_NEED_MORE);
		/* after the header the scanner is parked at the payload's end */
		if (have >= 5)
			cr_assert_eq(s.blob_end, sizeof(buf));
	}
	cr_assert_eq(pgc_scanner_feed(&s, buf, sizeof(buf), &fl), PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, sizeof(buf));
}

/* --- envelopes --- */

struct packed {
	msgpack_sbuffer sbuf;
	msgpack_packer pk;
	msgpack_unpacked u;
};

static void packed_init(struct packed *p)
{
	msgpack_sbuffer_init(&p->sbuf);
	msgpack_packer_init(&p->pk, &p->sbuf, msgpack_sbuffer_write);
	msgpack_unpacked_init(&p->u);
}

/* Decodes what was packed, checking the scanner agrees on where it ends. */
static const msgpack_object *packed_decode(struct packed *p)
{
	size_t fl = 0, off = 0;

	cr_assert_eq(pgc_frame_scan(p->sbuf.data, p->sbuf.size, PGC_DEFAULT_MAX_MESSAGE,
				    PGC_DEFAULT_MAX_DEPTH, &fl),
		     PGC_SCAN_COMPLETE);
	cr_assert_eq(fl, p->sbuf.size);
	cr_assert_eq(msgpack_unpack_next(&p->u, p->sbuf.data, p->sbuf.size, &off),
		     MSGPACK_UNPACK_SUCCESS);
	return &p->u.data;
}

static void packed_finish(struct packed *p)
{
	msgpack_unpacked_destroy(&p->u);
	msgpack_sbuffer_destroy(&p->sbuf);
}

static void expect_invalid(struct packed *p, const char *want_in_err)
{
	struct pgc_message m;
	char err[256] = "";

	cr_assert_not(pgc_parse_message(packed_decode(p), &m, err, sizeof(err)),
		      "accepted; wanted \"%s\"", want_in_err);
	cr_assert_not_null(strstr(err, want_in_err), "error \"%s\" does not contain \"%s\"", err,
			   want_in_err);
	packed_finish(p);
}

Test(envelope, request_with_params_map)
{
	struct packed p;
	struct pgc_message m;
	char err[128];
	int64_t v = 0;

	packed_init(&p);
	pgc_pack_request_begin(&p.pk, 42, "session.open");
	msgpack_pack_map(&p.pk, 2);
	pgc_pack_kv_str(&p.pk, "name", "worker");
	pgc_pack_kv_int(&p.pk, "resume", -7);

	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.type, PGC_RPC_REQUEST);
	cr_assert_eq(m.msgid, 42);
	cr_assert_eq(m.method_len, strlen("session.open"));
	cr_assert_eq(memcmp(m.method, "session.open", m.method_len), 0);
	cr_assert_not_null(m.params);
	cr_assert(pgc_obj_str_eq(pgc_map_get(m.params, "name"), "worker"));
	cr_assert(pgc_obj_int64(pgc_map_get(m.params, "resume"), &v));
	cr_assert_eq(v, -7);
	cr_assert_null(m.error);
	cr_assert_null(m.result);
	packed_finish(&p);
}

Test(envelope, request_with_empty_params_array_has_null_params)
{
	struct packed p;
	struct pgc_message m;
	char err[128];

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint32(&p.pk, UINT32_MAX);
	pgc_pack_cstr(&p.pk, "agent.ping");
	msgpack_pack_array(&p.pk, 0);

	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.type, PGC_RPC_REQUEST);
	cr_assert_eq(m.msgid, UINT32_MAX);
	cr_assert_null(m.params);
	packed_finish(&p);
}

Test(envelope, notification)
{
	struct packed p;
	struct pgc_message m;
	char err[128];
	int64_t session = 0;

	packed_init(&p);
	pgc_pack_notify_begin(&p.pk, "session.lost");
	msgpack_pack_map(&p.pk, 2);
	pgc_pack_kv_int(&p.pk, "session", INT64_MAX);
	pgc_pack_kv_str(&p.pk, "reason", "superseded");

	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.type, PGC_RPC_NOTIFY);
	cr_assert_eq(m.method_len, strlen("session.lost"));
	cr_assert_eq(memcmp(m.method, "session.lost", m.method_len), 0);
	cr_assert(pgc_obj_int64(pgc_map_get(m.params, "session"), &session));
	cr_assert_eq(session, INT64_MAX);
	packed_finish(&p);
}

Test(envelope, response_ok)
{
	struct packed p;
	struct pgc_message m;
	char err[128];
	bool pong = false;

	packed_init(&p);
	pgc_pack_response_ok_begin(&p.pk, 9);
	msgpack_pack_map(&p.pk, 1);
	pgc_pack_kv_bool(&p.pk, "pong", true);

	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.type, PGC_RPC_RESPONSE);
	cr_assert_eq(m.msgid, 9);
	cr_assert_null(m.error);
	cr_assert_not_null(m.result);
	cr_assert(pgc_obj_bool(pgc_map_get(m.result, "pong"), &pong));
	cr_assert(pong);
	packed_finish(&p);
}

Test(envelope, response_error_carries_code_message_retryable)
{
	struct packed p;
	struct pgc_message m;
	char err[128];
	const char *code;
	size_t code_len;
	bool retryable = false;

	packed_init(&p);
	pgc_pack_response_error(&p.pk, 77, pgc_error_name(PGC_E_BUSY), "64 requests in flight",
				pgc_error_retryable(PGC_E_BUSY));

	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert_eq(m.type, PGC_RPC_RESPONSE);
	cr_assert_eq(m.msgid, 77);
	cr_assert_not_null(m.error);
	cr_assert_eq(m.result->type, MSGPACK_OBJECT_NIL);
	cr_assert(pgc_obj_str(pgc_map_get(m.error, "code"), &code, &code_len));
	cr_assert_eq(pgc_error_from_name(code, code_len), PGC_E_BUSY);
	cr_assert(pgc_obj_str_eq(pgc_map_get(m.error, "message"), "64 requests in flight"));
	cr_assert(pgc_obj_bool(pgc_map_get(m.error, "retryable"), &retryable));
	cr_assert(retryable);
	packed_finish(&p);
}

Test(envelope, response_error_with_null_message_still_sends_a_str)
{
	struct packed p;
	struct pgc_message m;
	char err[128];

	packed_init(&p);
	pgc_pack_response_error(&p.pk, 1, "internal", NULL, false);
	cr_assert(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)), "%s", err);
	cr_assert(pgc_obj_str_eq(pgc_map_get(m.error, "message"), ""));
	packed_finish(&p);
}

Test(envelope, not_an_array)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_map(&p.pk, 0);
	expect_invalid(&p, "message must be an array, got map");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 0);
	expect_invalid(&p, "message must be a non-empty array");
}

Test(envelope, bad_type_element)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 3);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "m");
	msgpack_pack_array(&p.pk, 0);
	expect_invalid(&p, "message type must be 0, 1 or 2");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_int8(&p.pk, -1);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "m");
	msgpack_pack_array(&p.pk, 0);
	expect_invalid(&p, "message type");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	pgc_pack_cstr(&p.pk, "0");
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "m");
	msgpack_pack_array(&p.pk, 0);
	expect_invalid(&p, "message type");
}

Test(envelope, request_wrong_length)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_array(&p.pk, 3);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "m");
	expect_invalid(&p, "request must have 4 elements, got 3");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 5);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "m");
	msgpack_pack_array(&p.pk, 0);
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "request must have 4 elements, got 5");
}

static void pack_request_with_msgid(struct packed *p, int which)
{
	msgpack_pack_array(&p->pk, 4);
	msgpack_pack_uint8(&p->pk, 0);
	switch (which) {
	case 0:
		msgpack_pack_int64(&p->pk, -1);
		break;
	case 1:
		msgpack_pack_uint64(&p->pk, (uint64_t)UINT32_MAX + 1);
		break;
	case 2:
		pgc_pack_cstr(&p->pk, "1");
		break;
	case 3:
		msgpack_pack_double(&p->pk, 1.0);
		break;
	default:
		msgpack_pack_nil(&p->pk);
		break;
	}
	pgc_pack_cstr(&p->pk, "agent.ping");
	msgpack_pack_array(&p->pk, 0);
}

Test(envelope, request_msgid_must_be_uint32)
{
	for (int which = 0; which < 5; which++) {
		struct packed p;
		packed_init(&p);
		pack_request_with_msgid(&p, which);
		expect_invalid(&p, "request msgid must be an unsigned 32-bit integer");
	}
}

Test(envelope, bad_method_after_msgid_still_reports_type_and_msgid)
{
	struct packed p;
	struct pgc_message m;
	char err[128] = "";

	for (int which = 0; which < 3; which++) {
		packed_init(&p);
		msgpack_pack_array(&p.pk, 4);
		msgpack_pack_uint8(&p.pk, 0);
		msgpack_pack_uint32(&p.pk, 1234);
		if (which == 0)
			pgc_pack_cstr(&p.pk, "");
		else if (which == 1)
			msgpack_pack_uint8(&p.pk, 5);
		else
			msgpack_pack_bin_with_body(&p.pk, "agent.ping", 10);
		msgpack_pack_array(&p.pk, 0);

		cr_assert_not(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)));
		cr_assert_str_eq(err, "request method must be a non-empty str");
		cr_assert_eq(m.type, PGC_RPC_REQUEST);
		cr_assert_eq(m.msgid, 1234);
		packed_finish(&p);
	}
}

Test(envelope, request_params_shape)
{
	struct packed p;
	struct pgc_message m;
	char err[128] = "";

	/* A bare map, not wrapped in an array. */
	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "agent.ping");
	msgpack_pack_map(&p.pk, 0);
	cr_assert_not(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)));
	cr_assert_str_eq(err, "request params must be an array of 0 or 1 element, got map");
	cr_assert_eq(m.msgid, 1, "msgid is known, so the caller can reply to it");
	packed_finish(&p);

	packed_init(&p);
	pgc_pack_request_begin(&p.pk, 1, "agent.ping");
	msgpack_pack_uint8(&p.pk, 1);
	expect_invalid(&p, "request params[0] must be a map, got int");

	packed_init(&p);
	pgc_pack_request_begin(&p.pk, 1, "agent.ping");
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "request params[0] must be a map, got nil");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "agent.ping");
	msgpack_pack_array(&p.pk, 2);
	msgpack_pack_map(&p.pk, 0);
	msgpack_pack_map(&p.pk, 0);
	expect_invalid(&p, "request params must be an array of 0 or 1 element, got 2 elements");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 0);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "agent.ping");
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "request params must be an array of 0 or 1 element, got nil");
}

Test(envelope, bad_notifications)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 2);
	pgc_pack_cstr(&p.pk, "session.lost");
	msgpack_pack_array(&p.pk, 0);
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "notification must have 3 elements, got 4");

	packed_init(&p);
	pgc_pack_notify_begin(&p.pk, "");
	msgpack_pack_map(&p.pk, 0);
	expect_invalid(&p, "notification method must be a non-empty str");

	packed_init(&p);
	pgc_pack_notify_begin(&p.pk, "session.lost");
	pgc_pack_cstr(&p.pk, "x");
	expect_invalid(&p, "notification params[0] must be a map, got str");
}

Test(envelope, bad_responses)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_array(&p.pk, 3);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "response must have 4 elements, got 3");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_int8(&p.pk, -3);
	msgpack_pack_nil(&p.pk);
	msgpack_pack_map(&p.pk, 0);
	expect_invalid(&p, "response msgid must be an unsigned 32-bit integer");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_uint8(&p.pk, 1);
	pgc_pack_cstr(&p.pk, "busy");
	msgpack_pack_nil(&p.pk);
	expect_invalid(&p, "response error must be nil or a map, got str");

	packed_init(&p);
	msgpack_pack_array(&p.pk, 4);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_uint8(&p.pk, 1);
	msgpack_pack_map(&p.pk, 0);
	msgpack_pack_map(&p.pk, 0);
	expect_invalid(&p, "response result must be nil when error is set, got map");

	packed_init(&p);
	pgc_pack_response_ok_begin(&p.pk, 1);
	msgpack_pack_true(&p.pk);
	expect_invalid(&p, "response result must be a map, got bool");
}

Test(envelope, short_or_missing_error_buffer_is_safe)
{
	struct packed p;
	struct pgc_message m;
	char err[8];

	packed_init(&p);
	msgpack_pack_nil(&p.pk);
	memset(err, 'x', sizeof(err));
	cr_assert_not(pgc_parse_message(packed_decode(&p), &m, err, sizeof(err)));
	cr_assert_str_eq(err, "message");
	cr_assert_not(pgc_parse_message(&p.u.data, &m, NULL, 0));
	cr_assert_not(pgc_parse_message(NULL, &m, err, sizeof(err)));
	packed_finish(&p);
}

/* --- typed reads --- */

static msgpack_object obj_pos(uint64_t v)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = v};
	return o;
}

static msgpack_object obj_neg(int64_t v)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = v};
	return o;
}

static msgpack_object obj_str(const char *s, uint32_t n)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_STR, .via.str = {n, s}};
	return o;
}

Test(typed_read, int64_accepts_the_whole_signed_range_only)
{
	int64_t v = 5;
	msgpack_object o;

	o = obj_pos(INT64_MAX);
	cr_assert(pgc_obj_int64(&o, &v));
	cr_assert_eq(v, INT64_MAX);
	o = obj_neg(INT64_MIN);
	cr_assert(pgc_obj_int64(&o, &v));
	cr_assert_eq(v, INT64_MIN);
	o = obj_neg(-1);
	cr_assert(pgc_obj_int64(&o, &v));
	cr_assert_eq(v, -1);

	v = 5;
	o = obj_pos((uint64_t)INT64_MAX + 1);
	cr_assert_not(pgc_obj_int64(&o, &v));
	cr_assert_eq(v, 5, "left alone on failure");
	o = obj_str("1", 1);
	cr_assert_not(pgc_obj_int64(&o, &v));
	cr_assert_not(pgc_obj_int64(NULL, &v));
	cr_assert_eq(v, 5);
}

Test(typed_read, uint64_bool_double)
{
	uint64_t u = 3;
	bool b = false;
	double d = 0;
	msgpack_object o;

	o = obj_pos(UINT64_MAX);
	cr_assert(pgc_obj_uint64(&o, &u));
	cr_assert_eq(u, UINT64_MAX);
	u = 3;
	o = obj_neg(-1);
	cr_assert_not(pgc_obj_uint64(&o, &u));
	cr_assert_eq(u, 3);

	o = (msgpack_object){.type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = true};
	cr_assert(pgc_obj_bool(&o, &b));
	cr_assert(b);
	o = obj_pos(1);
	cr_assert_not(pgc_obj_bool(&o, &b), "1 is not true");

	o = (msgpack_object){.type = MSGPACK_OBJECT_FLOAT64, .via.f64 = 2.5};
	cr_assert(pgc_obj_double(&o, &d));
	cr_assert_eq(d, 2.5);
	o = (msgpack_object){.type = MSGPACK_OBJECT_FLOAT32, .via.f64 = 0.5};
	cr_assert(pgc_obj_double(&o, &d));
	cr_assert_eq(d, 0.5);
	o = obj_pos(7);
	cr_assert(pgc_obj_double(&o, &d));
	cr_assert_eq(d, 7.0);
	o = obj_neg(-7);
	cr_assert(pgc_obj_double(&o, &d));
	cr_assert_eq(d, -7.0);
	d = 1.5;
	o = obj_str("2", 1);
	cr_assert_not(pgc_obj_double(&o, &d));
	cr_assert_eq(d, 1.5);
}

Test(typed_read, strings)
{
	const char *s = NULL;
	size_t n = 99;
	msgpack_object o = obj_str("abc", 3);
	msgpack_object empty = obj_str("", 0);
	msgpack_object with_nul = obj_str("a\0b", 3);
	msgpack_object num = obj_pos(1);

	cr_assert(pgc_obj_str(&o, &s, &n));
	cr_assert_eq(n, 3);
	cr_assert_eq(memcmp(s, "abc", 3), 0);
	cr_assert_not(pgc_obj_str(&num, &s, &n));
	cr_assert_eq(n, 3);

	cr_assert(pgc_obj_str_eq(&o, "abc"));
	cr_assert_not(pgc_obj_str_eq(&o, "ab"));
	cr_assert_not(pgc_obj_str_eq(&o, "abcd"));
	cr_assert(pgc_obj_str_eq(&empty, ""));
	cr_assert_not(pgc_obj_str_eq(&num, "1"));
	cr_assert_not(pgc_obj_str_eq(&with_nul, "a"), "a NUL must not end the comparison");

	char *dup = pgc_obj_strdup(&o);
	cr_assert_str_eq(dup, "abc");
	free(dup);
	dup = pgc_obj_strdup(&empty);
	cr_assert_str_eq(dup, "");
	free(dup);
	cr_assert_null(pgc_obj_strdup(&with_nul));
	cr_assert_null(pgc_obj_strdup(&num));
	cr_assert_null(pgc_obj_strdup(NULL));
}

Test(typed_read, map_get)
{
	msgpack_object_kv kvs[4] = {
	    {.key = obj_pos(1), .val = obj_pos(10)},
	    {.key = obj_str("k", 1), .val = obj_pos(20)},
	    {.key = obj_str("k", 1), .val = obj_pos(30)},
	    {.key = obj_str("key", 3), .val = obj_pos(40)},
	};
	msgpack_object map = {.type = MSGPACK_OBJECT_MAP, .via.map = {4, kvs}};
	msgpack_object not_map = obj_str("k", 1);
	uint64_t v = 0;

	cr_assert(pgc_obj_uint64(pgc_map_get(&map, "k"), &v));
	cr_assert_eq(v, 20, "first of duplicate keys wins");
	cr_assert(pgc_obj_uint64(pgc_map_get(&map, "key"), &v));
	cr_assert_eq(v, 40);
	cr_assert_null(pgc_map_get(&map, "ke"));
	cr_assert_null(pgc_map_get(&map, "1"), "int keys never match");
	cr_assert_null(pgc_map_get(&not_map, "k"));
	cr_assert_null(pgc_map_get(NULL, "k"));
}

Test(typed_read, type_names)
{
	msgpack_object o = {.type = MSGPACK_OBJECT_NIL};

	cr_assert_str_eq(pgc_obj_type_name(NULL), "missing");
	cr_assert_str_eq(pgc_obj_type_name(&o), "nil");
	o.type = MSGPACK_OBJECT_BOOLEAN;
	cr_assert_str_eq(pgc_obj_type_name(&o), "bool");
	o.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
	cr_assert_str_eq(pgc_obj_type_name(&o), "int");
	o.type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
	cr_assert_str_eq(pgc_obj_type_name(&o), "int");
	o.type = MSGPACK_OBJECT_FLOAT32;
	cr_assert_str_eq(pgc_obj_type_name(&o), "float");
	o.type = MSGPACK_OBJECT_FLOAT64;
	cr_assert_str_eq(pgc_obj_type_name(&o), "float");
	o.type = MSGPACK_OBJECT_STR;
	cr_assert_str_eq(pgc_obj_type_name(&o), "str");
	o.type = MSGPACK_OBJECT_BIN;
	cr_assert_str_eq(pgc_obj_type_name(&o), "bin");
	o.type = MSGPACK_OBJECT_ARRAY;
	cr_assert_str_eq(pgc_obj_type_name(&o), "array");
	o.type = MSGPACK_OBJECT_MAP;
	cr_assert_str_eq(pgc_obj_type_name(&o), "map");
	o.type = MSGPACK_OBJECT_EXT;
	cr_assert_str_eq(pgc_obj_type_name(&o), "ext");
}

/* --- typed writes --- */

Test(typed_write, kv_helpers_round_trip)
{
	struct packed p;
	int64_t i = 0;
	bool b = true;
	double d = 0;

	packed_init(&p);
	msgpack_pack_map(&p.pk, 7);
	pgc_pack_kv_str(&p.pk, "s", "v");
	pgc_pack_kv_str(&p.pk, "null", NULL);
	pgc_pack_kv_int(&p.pk, "min", INT64_MIN);
	pgc_pack_kv_int(&p.pk, "max", INT64_MAX);
	pgc_pack_kv_bool(&p.pk, "b", false);
	pgc_pack_kv_double(&p.pk, "d", -0.25);
	pgc_pack_kv_nil(&p.pk, "nil");
	const msgpack_object *map = packed_decode(&p);

	cr_assert(pgc_obj_str_eq(pgc_map_get(map, "s"), "v"));
	cr_assert_eq(pgc_map_get(map, "null")->type, MSGPACK_OBJECT_NIL);
	cr_assert(pgc_obj_int64(pgc_map_get(map, "min"), &i));
	cr_assert_eq(i, INT64_MIN);
	cr_assert(pgc_obj_int64(pgc_map_get(map, "max"), &i));
	cr_assert_eq(i, INT64_MAX);
	cr_assert(pgc_obj_bool(pgc_map_get(map, "b"), &b));
	cr_assert_not(b);
	cr_assert(pgc_obj_double(pgc_map_get(map, "d"), &d));
	cr_assert_eq(d, -0.25);
	cr_assert_eq(pgc_map_get(map, "nil")->type, MSGPACK_OBJECT_NIL);
	packed_finish(&p);
}

Test(typed_write, strn_keeps_embedded_bytes_and_null_packs_nil)
{
	struct packed p;

	packed_init(&p);
	msgpack_pack_array(&p.pk, 3);
	pgc_pack_strn(&p.pk, "a\0b", 3);
	pgc_pack_strn(&p.pk, NULL, 5);
	pgc_pack_cstr(&p.pk, NULL);
	const msgpack_object *a = packed_decode(&p);

	cr_assert_eq(a->via.array.ptr[0].type, MSGPACK_OBJECT_STR);
	cr_assert_eq(a->via.array.ptr[0].via.str.size, 3);
	cr_assert_eq(memcmp(a->via.array.ptr[0].via.str.ptr, "a\0b", 3), 0);
	cr_assert_eq(a->via.array.ptr[1].type, MSGPACK_OBJECT_NIL);
	cr_assert_eq(a->via.array.ptr[2].type, MSGPACK_OBJECT_NIL);
	packed_finish(&p);
}

/* --- error table --- */

Test(error_table, names_follow_the_protocol_table_and_round_trip)
{
	static const char *const want[] = {
	    NULL,
	    "invalid_request",
	    "method_not_found",
	    "invalid_params",
	    "unavailable",
	    "timeout",
	    "busy",
	    "not_found",
	    "forbidden",
	    "no_session",
	    "session_expired",
	    "conflict",
	    "fenced",
	    "superseded",
	    "shutting_down",
	    "internal",
	    "too_large",
	};

	cr_assert_eq(PGC_E__COUNT, sizeof(want) / sizeof(want[0]));
	for (int c = PGC_E_INVALID_REQUEST; c < PGC_E__COUNT; c++) {
		const char *name = pgc_error_name((enum pgc_error_code)c);
		cr_assert_str_eq(name, want[c]);
		cr_assert_eq((int)pgc_error_from_name(name, strlen(name)), c, "%s", name);
	}
}

Test(error_table, only_transient_failures_are_retryable)
{
	for (int c = PGC_E_INVALID_REQUEST; c < PGC_E__COUNT; c++) {
		bool want = c == PGC_E_UNAVAILABLE || c == PGC_E_TIMEOUT || c == PGC_E_BUSY ||
			    c == PGC_E_SHUTTING_DOWN;
		cr_assert_eq(pgc_error_retryable((enum pgc_error_code)c), want, "%s",
			     pgc_error_name((enum pgc_error_code)c));
	}
}

Test(error_table, unknown_names_and_codes_map_to_internal)
{
	cr_assert_eq(pgc_error_from_name("no_such_error", 13), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name("bus", 3), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name("busy_", 5), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name("busy", 3), PGC_E_INTERNAL, "length is honoured");
	cr_assert_eq(pgc_error_from_name("busy\0", 5), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name("", 0), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name(NULL, 4), PGC_E_INTERNAL);
	cr_assert_eq(pgc_error_from_name("busy!", 4), PGC_E_BUSY, "name need not be terminated");

	cr_assert_str_eq(pgc_error_name((enum pgc_error_code)0), "internal");
	cr_assert_str_eq(pgc_error_name(PGC_E__COUNT), "internal");
	cr_assert_not(pgc_error_retryable((enum pgc_error_code)0));
	cr_assert_not(pgc_error_retryable(PGC_E__COUNT));
}
