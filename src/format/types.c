#include "format/types.h"

#include <stdint.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Splits "name(a,b)" into a lower-cased name and up to two numeric arguments; "max" is -1. */
static int parse_type(const char *text, char *name, size_t name_size, long args[2], int *nargs) {
    size_t n = 0;
    const char *p = text;
    while (*p == ' ')
        p++;
    while (*p && *p != '(' && *p != ' ') {
        if (n + 1 >= name_size)
            return -1;
        name[n++] = (char)tolower((unsigned char)*p++);
    }
    name[n] = '\0';
    while (*p == ' ')
        p++;
    *nargs = 0;
    if (*p != '(')
        return *p == '\0' ? 0 : -1;
    p++;
    while (*nargs < 2) {
        while (*p == ' ')
            p++;
        if (strncasecmp(p, "max", 3) == 0) {
            args[(*nargs)++] = -1;
            p += 3;
        } else {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > 1000000)
                return -1;
            args[(*nargs)++] = v;
            p = end;
        }
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
            continue;
        }
        break;
    }
    return *p == ')' ? 0 : -1;
}

static long cap6(long n) { return n > 6 ? 6 : n; }

bool ces_types_map(const char *sqlserver_type, char *buf, size_t size) {
    size_t prefix = sizeof(CES_TYPES_OVERRIDE_PREFIX) - 1;
    if (strncmp(sqlserver_type, CES_TYPES_OVERRIDE_PREFIX, prefix) == 0) {
        snprintf(buf, size, "%s", sqlserver_type + prefix);
        return true;
    }
    char name[32];
    long a[2] = {0, 0};
    int nargs = 0;
    if (parse_type(sqlserver_type, name, sizeof(name), a, &nargs) != 0)
        goto unknown;

    if (strcmp(name, "bit") == 0)
        snprintf(buf, size, "boolean");
    else if (strcmp(name, "tinyint") == 0 || strcmp(name, "smallint") == 0)
        snprintf(buf, size, "smallint");
    else if (strcmp(name, "int") == 0)
        snprintf(buf, size, "integer");
    else if (strcmp(name, "bigint") == 0)
        snprintf(buf, size, "bigint");
    else if (strcmp(name, "decimal") == 0 || strcmp(name, "numeric") == 0) {
        /* SQL Server's default precision is 18, scale 0. */
        long p = nargs >= 1 && a[0] > 0 ? a[0] : 18, s = nargs >= 2 ? a[1] : 0;
        if (p > 1000 || s > p)
            goto unknown;
        snprintf(buf, size, "numeric(%ld,%ld)", p, s);
    } else if (strcmp(name, "money") == 0)
        snprintf(buf, size, "numeric(19,4)");
    else if (strcmp(name, "smallmoney") == 0)
        snprintf(buf, size, "numeric(10,4)");
    else if (strcmp(name, "real") == 0)
        snprintf(buf, size, "real");
    else if (strcmp(name, "float") == 0)
        snprintf(buf, size, nargs >= 1 && a[0] >= 1 && a[0] <= 24 ? "real" : "double precision");
    else if (strcmp(name, "date") == 0)
        snprintf(buf, size, "date");
    else if (strcmp(name, "time") == 0)
        snprintf(buf, size, "time(%ld)", nargs >= 1 ? cap6(a[0]) : 6);
    else if (strcmp(name, "datetime") == 0)
        snprintf(buf, size, "timestamp(3)");
    else if (strcmp(name, "smalldatetime") == 0)
        snprintf(buf, size, "timestamp(0)");
    else if (strcmp(name, "datetime2") == 0)
        snprintf(buf, size, "timestamp(%ld)", nargs >= 1 ? cap6(a[0]) : 6);
    else if (strcmp(name, "datetimeoffset") == 0)
        snprintf(buf, size, "timestamptz(%ld)", nargs >= 1 ? cap6(a[0]) : 6);
    else if (strcmp(name, "char") == 0 || strcmp(name, "nchar") == 0)
        snprintf(buf, size, "char(%ld)", nargs >= 1 && a[0] > 0 ? a[0] : 1);
    else if (strcmp(name, "varchar") == 0 || strcmp(name, "nvarchar") == 0) {
        if (nargs >= 1 && a[0] == -1)
            snprintf(buf, size, "text");
        else
            snprintf(buf, size, "varchar(%ld)", nargs >= 1 && a[0] > 0 ? a[0] : 1);
    } else if (strcmp(name, "binary") == 0 || strcmp(name, "varbinary") == 0)
        snprintf(buf, size, "bytea");
    else if (strcmp(name, "uniqueidentifier") == 0)
        snprintf(buf, size, "uuid");
    else
        goto unknown;
    return true;
unknown:
    snprintf(buf, size, "text");
    return false;
}

typedef enum { FAM_TEXT, FAM_NUMBER, FAM_BOOL, FAM_DATE, FAM_TIME, FAM_TIMESTAMP, FAM_BYTES, FAM_UUID, FAM_OTHER } family_t;

static family_t family_of_typname(const char *t) {
    static const struct {
        const char *name;
        family_t family;
    } names[] = {
        {"text", FAM_TEXT},       {"varchar", FAM_TEXT},          {"bpchar", FAM_TEXT},
        {"int2", FAM_NUMBER},     {"int4", FAM_NUMBER},           {"int8", FAM_NUMBER},
        {"numeric", FAM_NUMBER},  {"float4", FAM_NUMBER},         {"float8", FAM_NUMBER},
        {"bool", FAM_BOOL},       {"date", FAM_DATE},             {"time", FAM_TIME},
        {"timestamp", FAM_TIMESTAMP}, {"timestamptz", FAM_TIMESTAMP}, {"bytea", FAM_BYTES},
        {"uuid", FAM_UUID},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(names[i].name, t) == 0)
            return names[i].family;
    }
    return FAM_OTHER;
}

static family_t family_of_mapped(const char *m) {
    static const struct {
        const char *prefix;
        family_t family;
    } prefixes[] = {
        {"timestamptz", FAM_TIMESTAMP}, {"timestamp", FAM_TIMESTAMP}, {"time", FAM_TIME},
        {"date", FAM_DATE},             {"boolean", FAM_BOOL},        {"smallint", FAM_NUMBER},
        {"integer", FAM_NUMBER},        {"bigint", FAM_NUMBER},       {"numeric", FAM_NUMBER},
        {"real", FAM_NUMBER},           {"double precision", FAM_NUMBER},
        {"char", FAM_TEXT},             {"varchar", FAM_TEXT},        {"text", FAM_TEXT},
        {"bytea", FAM_BYTES},           {"uuid", FAM_UUID},
    };
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        if (strncmp(m, prefixes[i].prefix, strlen(prefixes[i].prefix)) == 0)
            return prefixes[i].family;
    }
    return FAM_OTHER;
}

bool ces_types_compatible(const char *target_typname, const char *mapped_type) {
    family_t target = family_of_typname(target_typname);
    if (target == FAM_TEXT || target == FAM_OTHER)
        return true; /* text takes anything; other types were chosen by the user: trust them */
    return target == family_of_mapped(mapped_type);
}

long ces_base64_decode(const char *in, size_t len, unsigned char *out) {
    static signed char table[256];
    static int ready = 0;
    if (!ready) {
        memset(table, -1, sizeof(table));
        const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; i++)
            table[(unsigned char)alphabet[i]] = (signed char)i;
        ready = 1;
    }
    while (len > 0 && in[len - 1] == '=')
        len--;
    if (len % 4 == 1)
        return -1;
    long n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = table[(unsigned char)in[i]];
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

ces_conv_t ces_types_conversion(const char *pg_type) {
    if (strcmp(pg_type, "bytea") == 0)
        return CES_CONV_BYTEA;
    return CES_CONV_NONE;
}

const char *ces_types_convert(ces_conv_t conv, const char *value, size_t len, ces_arena_t *arena,
                              size_t *out_len) {
    *out_len = len;
    switch (conv) {
    case CES_CONV_NONE:
        return value;
    case CES_CONV_BYTEA:
        if (len >= 2 && value[0] == '0' && (value[1] == 'x' || value[1] == 'X')) {
            char *copy = ces_arena_strndup(arena, value, len);
            if (copy == NULL)
                return NULL;
            copy[0] = '\\';
            copy[1] = 'x';
            return copy;
        }
        if (len > 0 && len % 4 == 0) {
            /* Some renderings of binary columns are base64: turn them into hex. A value that is not
             * base64 either goes as it is, and PostgreSQL says what is wrong with it. */
            unsigned char *bytes = ces_arena_alloc(arena, len / 4 * 3 + 3);
            if (bytes == NULL)
                return NULL;
            long n = ces_base64_decode(value, len, bytes);
            if (n < 0)
                return value;
            static const char hex[] = "0123456789abcdef";
            char *out = ces_arena_alloc(arena, (size_t)n * 2 + 3);
            if (out == NULL)
                return NULL;
            out[0] = '\\';
            out[1] = 'x';
            for (long i = 0; i < n; i++) {
                out[2 + 2 * i] = hex[bytes[i] >> 4];
                out[3 + 2 * i] = hex[bytes[i] & 15];
            }
            out[2 + 2 * n] = '\0';
            *out_len = (size_t)n * 2 + 2;
            return out;
        }
        return value;
    }
    return value;
}

char *ces_base64_encode(const void *data, size_t len) {
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *in = data;
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        out[o++] = alphabet[(v >> 18) & 63];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}
