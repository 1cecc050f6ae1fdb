/*
 * utf8: checks that untrusted text is UTF-8 in its shortest form.
 *
 * Every record's text is checked once, whole, before yajl reads it (yajl checks only the shape of
 * multi-byte sequences, and more slowly). On x86-64 processors with SSSE3 the check reads 16 bytes
 * at a time with vector table lookups; text in other scripts, where ASCII and multi-byte sequences
 * alternate every few bytes, made the byte-at-a-time check an eighth of decoding a large event.
 */
#ifndef CES_UTF8_H
#define CES_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* True when s[0..len) is UTF-8 in its shortest form, without surrogates, at most U+10FFFF. */
bool ces_utf8_valid(const char *s, size_t len);

/* The offset of the first byte of s[0..len) that breaks ces_utf8_valid's rules (the first byte
 * of the sequence that breaks them), or len. */
size_t ces_utf8_check(const char *s, size_t len);

/* The same, one sequence at a time, on every processor: what ces_utf8_check falls back to, and
 * what finds the offset once the vector check has seen an error. Declared for the unit test, which
 * holds both to the Unicode standard's definition. */
size_t ces_utf8_check_scalar(const char *s, size_t len);

/* The vector check alone: 1 when s[0..len) is valid, 0 when not, -1 on a processor without it.
 * Declared for the unit test: ces_utf8_check trusts its 1 and falls back on its 0. */
int ces_utf8_check_vector(const char *s, size_t len);

#endif
