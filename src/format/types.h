/*
 * types: SQL Server column types to PostgreSQL types (docs/semantics.md, "Schema"), and the few value
 * conversions needed where PostgreSQL's input syntax differs from SQL Server's text.
 */
#ifndef CES_TYPES_H
#define CES_TYPES_H

#include <stdbool.h>
#include <stddef.h>

#include "util/arena.h"

typedef enum {
    CES_CONV_NONE = 0, /* PostgreSQL reads SQL Server's text as it is */
    CES_CONV_BYTEA,    /* 0x-prefixed hex (or, tolerated, base64) to PostgreSQL's \x hex */
} ces_conv_t;

/*
 * Maps a SQL Server type as CES writes it ("nvarchar(50)", "decimal(10,2)", "datetime2(7)") to a
 * PostgreSQL type written into buf ("varchar(50)", "numeric(10,2)", "timestamp(6)"). Returns true
 * when the type is known; unknown types map to "text" and return false (callers warn).
 */
bool ces_types_map(const char *sqlserver_type, char *buf, size_t size);

/* A column type a table rule chose in place of the source's (apply/columns.h) is carried in the
 * event as this prefix and the PostgreSQL type ("ces2pg:jsonb"), which ces_types_map maps to the
 * type itself. */
#define CES_TYPES_OVERRIDE_PREFIX "ces2pg:"

/*
 * Can a column of PostgreSQL base type target_typname (pg_type.typname, e.g. "int4") hold values of
 * a source column mapped to mapped_type (what ces_types_map wrote, e.g. "varchar(50)")? Text
 * columns hold anything; otherwise the families must agree (numbers, booleans, dates, times,
 * timestamps, bytes, uuids). False is a type conflict.
 */
bool ces_types_compatible(const char *target_typname, const char *mapped_type);

/* The conversion a value needs before PostgreSQL reads it into a column of pg_type (as printed by
 * format_type, e.g. "bytea"). */
ces_conv_t ces_types_conversion(const char *pg_type);

/*
 * Converts value[0..len) for conv. Returns value itself when nothing changes, else a NUL-terminated
 * copy allocated from arena; NULL when out of memory. *out_len receives the length.
 */
const char *ces_types_convert(ces_conv_t conv, const char *value, size_t len, ces_arena_t *arena,
                              size_t *out_len);

/* Decodes standard base64 (padding optional, no whitespace inside) from in[0..len) into out, which
 * must hold len * 3 / 4 + 3 bytes. Returns the decoded length, or -1 when in is not base64. */
long ces_base64_decode(const char *in, size_t len, unsigned char *out);
/* Encodes data[0..len) in standard base64 with padding into a new NUL-terminated string (free it);
 * NULL when out of memory. */
char *ces_base64_encode(const void *data, size_t len);

#endif
