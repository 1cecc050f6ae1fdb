/*
 * strbuf: a growable string for building SQL text.
 *
 * A value, not a handle: a zero-initialised ces_strbuf_t is an empty string, and
 * ces_strbuf_free releases what it grew. Failure is sticky: once memory runs out (or a formatted
 * fragment is too long), every later add does nothing and failed stays set, so a builder of many
 * fragments checks once at the end instead of after each one.
 */
#ifndef CES_STRBUF_H
#define CES_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *buf;   /* NUL-terminated; owned by the strbuf; NULL until the first add */
    size_t len;  /* bytes in buf, without the NUL */
    size_t cap;
    bool failed; /* out of memory or a fragment over CES_STRBUF_MAX_FRAGMENT: buf is incomplete */
} ces_strbuf_t;

/* The longest text ces_strbuf_addf formats: it is meant for numbers and short fragments. */
#define CES_STRBUF_MAX_FRAGMENT 255

/* Appends s (NUL-terminated). */
void ces_strbuf_add(ces_strbuf_t *sb, const char *s);

/* Appends the formatted text; a result longer than CES_STRBUF_MAX_FRAGMENT sets failed. */
void ces_strbuf_addf(ces_strbuf_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Empties sb and clears failed, keeping its memory for the next use. */
void ces_strbuf_reset(ces_strbuf_t *sb);

/* Frees buf and leaves sb empty (usable again). */
void ces_strbuf_free(ces_strbuf_t *sb);

#endif
