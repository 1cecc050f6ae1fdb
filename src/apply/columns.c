/*
 * columns: a table rule's choice of columns, made on the event (columns.h).
 */
#include "apply/columns.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "format/json.h"
#include "format/types.h"

bool ces_columns_any(const ces_columns_rule_t *r) {
    return r->ninclude > 0 || r->nexclude > 0 || r->nrename > 0 || r->ntypes > 0 || r->nmasks > 0;
}

static bool listed(const char *const *names, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(names[i], name) == 0)
            return true;
    }
    return false;
}

static bool kept(const ces_columns_rule_t *r, const char *name) {
    if (r->ninclude > 0 && !listed(r->include, r->ninclude, name))
        return false;
    return !listed(r->exclude, r->nexclude, name);
}

/* The new name of a source column, or NULL when it keeps its own. */
static const char *renamed(const ces_columns_rule_t *r, const char *name) {
    for (size_t i = 0; i < r->nrename; i++) {
        if (strcasecmp(r->rename_from[i], name) == 0)
            return r->rename_to[i];
    }
    return NULL;
}

/* The index of the type the rule gives the source column, or -1. */
static long typed(const ces_columns_rule_t *r, const char *name) {
    for (size_t i = 0; i < r->ntypes; i++) {
        if (strcasecmp(r->type_columns[i], name) == 0)
            return (long)i;
    }
    return -1;
}

/* The index of the mask the rule gives the source column, or -1. */
static long masked(const ces_columns_rule_t *r, const char *name) {
    for (size_t i = 0; i < r->nmasks; i++) {
        if (strcasecmp(r->mask_columns[i], name) == 0)
            return (long)i;
    }
    return -1;
}

static bool hash_mask(const ces_columns_rule_t *r, size_t k) {
    return strcmp(r->masks[k], "hash") == 0;
}

bool ces_columns_hash_masks(const ces_columns_rule_t *r) {
    for (size_t k = 0; k < r->nmasks; k++) {
        if (hash_mask(r, k))
            return true;
    }
    return false;
}

/* The value of a masked field (mask index k): its keyed hash (from arena), or NULL. Returns
 * CES_COLUMNS_OK, or -1 when out of memory or the rule's owner made no hasher. */
static int mask(const ces_columns_rule_t *r, size_t k, ces_field_t *f, ces_arena_t *arena) {
    if (f->is_null)
        return CES_COLUMNS_OK;
    if (!hash_mask(r, k)) {
        f->is_null = true;
        f->value = NULL;
        f->value_len = 0;
        return CES_COLUMNS_OK;
    }
    char *v = ces_arena_alloc(arena, CES_MASK_HEX_LEN + 1);
    if (v == NULL || r->hasher == NULL || ces_mask_hex(r->hasher, f->value, f->value_len, v) != 0)
        return -1;
    f->value = v;
    f->value_len = CES_MASK_HEX_LEN;
    return CES_COLUMNS_OK;
}

/* The type as the event carries it for the catalog (format/types.h). */
static const char *override_type(const char *type) {
    static const char *const known[] = {CES_TYPES_OVERRIDE_PREFIX "jsonb",
                                        CES_TYPES_OVERRIDE_PREFIX "json",
                                        CES_TYPES_OVERRIDE_PREFIX "timestamptz"};
    size_t prefix = sizeof(CES_TYPES_OVERRIDE_PREFIX) - 1;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strcmp(known[i] + prefix, type) == 0)
            return known[i];
    }
    return NULL;
}

static bool digits(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
    }
    return true;
}

/* "YYYY-MM-DD", then " HH:MM" or "THH:MM", ":SS" and ".f" (1 to 7 digits) optional: the local
 * date and time SQL Server's date, datetime, datetime2 and smalldatetime write, with no zone. */
static bool plain_timestamp(const char *v, size_t len) {
    if (len < 10 || !digits(v, 4) || v[4] != '-' || !digits(v + 5, 2) || v[7] != '-' ||
        !digits(v + 8, 2))
        return false;
    if (len == 10)
        return true;
    if (len < 16 || (v[10] != ' ' && v[10] != 'T') || !digits(v + 11, 2) || v[13] != ':' ||
        !digits(v + 14, 2))
        return false;
    size_t at = 16;
    if (at < len && v[at] == ':') {
        if (at + 3 > len || !digits(v + at + 1, 2))
            return false;
        at += 3;
        if (at < len && v[at] == '.') {
            size_t f = len - at - 1;
            if (f < 1 || f > 7 || !digits(v + at + 1, f))
                return false;
            at = len;
        }
    }
    return at == len;
}

/* The value of a field whose column the rule types (index k) in the form PostgreSQL reads: JSON
 * as it is, a local time with the zone appended. Returns CES_COLUMNS_OK, _NO_CONVERSION, or -1
 * when out of memory. */
static int convert(const ces_columns_rule_t *r, size_t k, ces_field_t *f, ces_arena_t *arena) {
    if (f->is_null)
        return CES_COLUMNS_OK;
    if (strcmp(r->types[k], "timestamptz") != 0)
        return ces_json_valid(f->value, f->value_len) ? CES_COLUMNS_OK : CES_COLUMNS_NO_CONVERSION;
    if (!plain_timestamp(f->value, f->value_len))
        return CES_COLUMNS_NO_CONVERSION;
    size_t zone = strlen(r->type_zones[k]);
    char *v = ces_arena_alloc(arena, f->value_len + zone + 2);
    if (v == NULL)
        return -1;
    memcpy(v, f->value, f->value_len);
    v[f->value_len] = ' ';
    memcpy(v + f->value_len + 1, r->type_zones[k], zone + 1);
    f->value = v;
    f->value_len += zone + 1;
    return CES_COLUMNS_OK;
}

static int apply_fields(const ces_columns_rule_t *r, ces_field_t *fields, size_t *n,
                        ces_arena_t *arena, const char **column) {
    size_t out = 0;
    for (size_t i = 0; i < *n; i++) {
        if (!kept(r, fields[i].name))
            continue;
        fields[out] = fields[i];
        long k = typed(r, fields[i].name), m = masked(r, fields[i].name);
        int rc = k >= 0   ? convert(r, (size_t)k, &fields[out], arena)
                 : m >= 0 ? mask(r, (size_t)m, &fields[out], arena)
                          : CES_COLUMNS_OK;
        if (rc != CES_COLUMNS_OK) {
            *column = fields[i].name;
            return rc;
        }
        const char *to = renamed(r, fields[i].name);
        if (to != NULL) {
            fields[out].name = to;
            fields[out].name_len = (uint32_t)strlen(to);
        }
        out++;
    }
    *n = out;
    return CES_COLUMNS_OK;
}

int ces_columns_apply(const ces_columns_rule_t *r, ces_event_t *ev, bool keys_needed,
                      ces_arena_t *arena, const char **column) {
    for (size_t i = 0; keys_needed && i < ev->npkkey; i++) {
        bool out = !kept(r, ev->pkkey[i].name);
        if (out || masked(r, ev->pkkey[i].name) >= 0) {
            *column = ev->pkkey[i].name;
            return out ? CES_COLUMNS_KEY_LEFT_OUT : CES_COLUMNS_KEY_MASKED;
        }
    }
    size_t out = 0;
    for (size_t i = 0; i < ev->ncols; i++) {
        if (!kept(r, ev->cols[i].name))
            continue;
        ev->cols[out] = ev->cols[i];
        long k = typed(r, ev->cols[i].name), m = masked(r, ev->cols[i].name);
        const char *type = k >= 0                         ? override_type(r->types[k])
                           : m >= 0 && hash_mask(r, (size_t)m) ? CES_TYPES_OVERRIDE_PREFIX "text"
                                                               : NULL;
        if (type != NULL) {
            ev->cols[out].type = type;
            ev->cols[out].type_len = (uint32_t)strlen(type);
        }
        const char *to = renamed(r, ev->cols[i].name);
        if (to != NULL) {
            ev->cols[out].name = to;
            ev->cols[out].name_len = (uint32_t)strlen(to);
        }
        out++;
    }
    ev->ncols = out;
    int rc;
    if ((rc = apply_fields(r, ev->pkkey, &ev->npkkey, arena, column)) != CES_COLUMNS_OK ||
        (rc = apply_fields(r, ev->current, &ev->ncurrent, arena, column)) != CES_COLUMNS_OK ||
        (rc = apply_fields(r, ev->old, &ev->nold, arena, column)) != CES_COLUMNS_OK)
        return rc;
    return CES_COLUMNS_OK;
}
