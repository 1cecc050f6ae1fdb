/*
 * types: SQL Server column types to PostgreSQL types (DESIGN.md "Schema"), and the few value
 * conversions needed where PostgreSQL's input syntax differs from SQL Server's text.
 */
#ifndef CES_TYPES_H
#define CES_TYPES_H

#include <stdbool.h>
#include <stddef.h>

#include "arena.h"

typedef enum {
    CES_CONV_NONE = 0, /* PostgreSQL reads SQL Server's text as it is */
    CES_CONV_BYTEA,    /* 0x-prefixed hex to PostgreSQL's \x hex */
} ces_conv_t;

/*
 * Maps a SQL Server type as CES writes it ("nvarchar(50)", "decimal(10,2)", "datetime2(7)") to a
 * PostgreSQL type written into buf ("varchar(50)", "numeric(10,2)", "timestamp(6)"). Returns true
 * when the type is known; unknown types map to "text" and return false (callers warn).
 */
bool ces_types_map(const char *sqlserver_type, char *buf, size_t size);

/* The conversion a value needs before PostgreSQL reads it into a column of pg_type (as printed by
 * format_type, e.g. "bytea"). */
ces_conv_t ces_types_conversion(const char *pg_type);

/*
 * Converts value[0..len) for conv. Returns value itself when nothing changes, else a NUL-terminated
 * copy allocated from arena; NULL when out of memory. *out_len receives the length.
 */
const char *ces_types_convert(ces_conv_t conv, const char *value, size_t len, ces_arena_t *arena,
                              size_t *out_len);

#endif
