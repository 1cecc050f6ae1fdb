#include "apply/tableplan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/types.h"
#include "util/array.h"
#include "util/strbuf.h"

/* FNV-1a, 32 bits: short, stable across builds and platforms, which is all a name suffix needs. */
static uint32_t name_hash(const char *name) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

/* The length of s clipped to at most max bytes without splitting a UTF-8 character. */
static size_t clip_utf8(const char *s, size_t max) {
    size_t len = strlen(s);
    if (len <= max)
        return len;
    len = max;
    while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
        len--;
    return len;
}

/* name (already folded) as a PostgreSQL name: as it is when it fits, else clipped with
 * "_<hash of source>" so that names differing only past the limit stay apart. */
static char *fit_name(const char *name, const char *source) {
    size_t len = strlen(name);
    if (len <= CES_CATALOG_NAME_MAX)
        return strdup(name);
    len = clip_utf8(name, CES_CATALOG_NAME_MAX - CES_TABLEPLAN_HASH_SUFFIX);
    char *out = malloc(CES_CATALOG_NAME_MAX + 1);
    if (out != NULL)
        snprintf(out, CES_CATALOG_NAME_MAX + 1, "%.*s_%08x", (int)len, name,
                 (unsigned)name_hash(source));
    return out;
}

char *ces_tableplan_fold_name(const char *name, bool preserve_case) {
    char *folded = strdup(name);
    if (folded == NULL)
        return NULL;
    for (char *p = folded; !preserve_case && *p; p++) {
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p + 32);
    }
    char *out = fit_name(folded, name);
    free(folded);
    return out;
}

/* The names of PostgreSQL's system columns, which no table may use for a column of its own. */
static const char *const system_columns[] = {"xmin", "xmax", "cmin", "cmax", "ctid", "tableoid"};

void ces_tableplan_describe_names(FILE *out, const char *version_column,
                                  const char *metadata_schema) {
    fprintf(out, "names: source columns named");
    for (size_t i = 0; i < sizeof(system_columns) / sizeof(system_columns[0]); i++)
        fprintf(out, "%s %s", i == 0 ? "" : ",", system_columns[i]);
    if (version_column != NULL)
        fprintf(out, " or %s (the version column)", version_column);
    fprintf(out, " are applied as %s<name> (logged once per table)\n",
            CES_TABLEPLAN_RESERVED_PREFIX);
    fprintf(out, "names: a name longer than %d bytes becomes its first %d bytes, \"_\" and 8 hex "
                 "digits of a hash of the whole name\n",
            CES_CATALOG_NAME_MAX, CES_CATALOG_NAME_MAX - CES_TABLEPLAN_HASH_SUFFIX);
    fprintf(out, "names: events for schema %s (ces2pg's), pg_catalog, information_schema or any "
                 "pg_* schema are dead letters (class reserved_target); two source tables meeting "
                 "in one target table are too (class name_collision)\n",
            metadata_schema);
}

bool ces_tableplan_reserved_column(const char *pg_name, const char *version_column) {
    if (pg_name[0] == '\0' || (version_column != NULL && strcmp(pg_name, version_column) == 0))
        return true;
    for (size_t i = 0; i < sizeof(system_columns) / sizeof(system_columns[0]); i++) {
        if (strcmp(pg_name, system_columns[i]) == 0)
            return true;
    }
    return false;
}

char *ces_tableplan_column_name(const char *name, bool preserve_case, const char *version_column,
                                bool *renamed) {
    char *folded = ces_tableplan_fold_name(name, preserve_case);
    if (renamed != NULL)
        *renamed = false;
    if (folded == NULL || !ces_tableplan_reserved_column(folded, version_column))
        return folded;
    if (renamed != NULL)
        *renamed = true;
    char *prefixed = malloc(sizeof(CES_TABLEPLAN_RESERVED_PREFIX) + strlen(folded));
    char *out = NULL;
    if (prefixed != NULL) {
        sprintf(prefixed, "%s%s", CES_TABLEPLAN_RESERVED_PREFIX, folded);
        out = fit_name(prefixed, name);
    }
    free(prefixed);
    free(folded);
    return out;
}

const char *ces_tableplan_reserved_target(const char *pg_schema, const char *pg_table,
                                          const char *metadata_schema) {
    if (pg_schema[0] == '\0' || pg_table[0] == '\0')
        return "the target name is empty";
    if (metadata_schema != NULL && strcmp(pg_schema, metadata_schema) == 0)
        return "the target is in ces2pg's metadata schema";
    if (strncmp(pg_schema, "pg_", 3) == 0 || strcmp(pg_schema, "information_schema") == 0)
        return "the target is in a PostgreSQL system schema";
    return NULL;
}

char *ces_tableplan_expand_target(const char *pattern, const ces_event_t *ev) {
    ces_strbuf_t out = {0};
    for (const char *p = pattern; *p;) {
        if (strncmp(p, "{db}", 4) == 0) {
            ces_strbuf_add(&out, ev->db);
            p += 4;
        } else if (strncmp(p, "{schema}", 8) == 0) {
            ces_strbuf_add(&out, ev->schema);
            p += 8;
        } else if (strncmp(p, "{table}", 7) == 0) {
            ces_strbuf_add(&out, ev->table);
            p += 7;
        } else {
            char c[2] = {*p++, '\0'};
            ces_strbuf_add(&out, c);
        }
    }
    if (out.failed) {
        ces_strbuf_free(&out);
        return NULL;
    }
    return out.buf != NULL ? out.buf : strdup("");
}

const char *ces_tableplan_new_column_type(const ces_event_t *ev, const char *source_name,
                                           char *buf, size_t size) {
    const char *type = NULL;
    for (size_t i = 0; i < ev->ncols && type == NULL; i++) {
        if (strcmp(ev->cols[i].name, source_name) == 0)
            type = ev->cols[i].type;
    }
    if (type == NULL) {
        snprintf(buf, size, "text");
        return NULL;
    }
    return ces_types_map(type, buf, size) ? NULL : type;
}

/* Source names of every column the event mentions, each once. */
typedef struct {
    const char **names;
    size_t count, capacity;
} namelist_t;

static int namelist_add(namelist_t *l, const char *name) {
    for (size_t i = 0; i < l->count; i++) {
        if (strcmp(l->names[i], name) == 0)
            return 0;
    }
    const char **n = CES_ARRAY_RESERVE(l->names, l->capacity, l->count + 1, 16);
    if (n == NULL)
        return -1;
    l->names = n;
    l->names[l->count++] = name;
    return 0;
}

static int namelist_add_fields(namelist_t *l, const ces_field_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (namelist_add(l, fields[i].name) != 0)
            return -1;
    }
    return 0;
}

int ces_tableplan_event_columns(const ces_event_t *ev, const char ***names, size_t *count) {
    namelist_t l = {0};
    int rc = -1;
    for (size_t i = 0; i < ev->ncols; i++) {
        if (namelist_add(&l, ev->cols[i].name) != 0)
            goto done;
    }
    if (namelist_add_fields(&l, ev->pkkey, ev->npkkey) != 0 ||
        namelist_add_fields(&l, ev->current, ev->ncurrent) != 0 ||
        namelist_add_fields(&l, ev->old, ev->nold) != 0)
        goto done;
    rc = 0;
done:
    if (rc != 0) {
        free(l.names);
        l = (namelist_t){0};
    }
    *names = l.names;
    *count = l.count;
    return rc;
}

long ces_tableplan_column_index(const ces_catalog_desc_t *t, const char *pg_name) {
    for (size_t i = 0; i < t->ncols; i++) {
        if (strcmp(t->cols[i].name, pg_name) == 0)
            return (long)i;
    }
    return -1;
}

int ces_tableplan_missing_columns(const ces_catalog_desc_t *t, bool preserve_case,
                                   const char *version_column, const ces_event_t *ev,
                                   const char ***missing, size_t *nmissing) {
    const char **names = NULL;
    size_t count = 0;
    int rc = -1;
    *missing = NULL;
    *nmissing = 0;
    if (ces_tableplan_event_columns(ev, &names, &count) != 0 ||
        (*missing = calloc(count + 1, sizeof(char *))) == NULL)
        goto done;
    for (size_t i = 0; i < count; i++) {
        char *folded = ces_tableplan_column_name(names[i], preserve_case, version_column, NULL);
        if (folded == NULL)
            goto done;
        if (ces_tableplan_column_index(t, folded) < 0)
            (*missing)[(*nmissing)++] = names[i];
        free(folded);
    }
    rc = 0;
done:
    if (rc != 0) {
        free(*missing);
        *missing = NULL;
        *nmissing = 0;
    }
    free(names);
    return rc;
}

int ces_tableplan_column_collision(const ces_event_t *ev, bool preserve_case,
                                   const char *version_column, const char **first,
                                   const char **second) {
    const char **names = NULL;
    size_t count = 0;
    char **mapped = NULL;
    int rc = -1;
    *first = *second = NULL;
    if (ces_tableplan_event_columns(ev, &names, &count) != 0 ||
        (mapped = calloc(count + 1, sizeof(char *))) == NULL)
        goto done;
    rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        mapped[i] = ces_tableplan_column_name(names[i], preserve_case, version_column, NULL);
        if (mapped[i] == NULL) {
            rc = -1;
            break;
        }
        /* names are distinct (event_columns lists each once): equal targets are a collision. */
        for (size_t j = 0; j < i && rc == 0; j++) {
            if (strcmp(mapped[j], mapped[i]) == 0) {
                *first = names[j];
                *second = names[i];
                rc = 1;
            }
        }
    }
done:
    for (size_t i = 0; mapped != NULL && i < count; i++)
        free(mapped[i]);
    free(mapped);
    free(names);
    return rc;
}

bool ces_tableplan_type_conflicts(const char *target_cast, const char *source_type) {
    char mapped[64];
    ces_types_map(source_type, mapped, sizeof(mapped));
    const char *dot = strrchr(target_cast, '.');
    const char *typname = dot ? dot + 1 : target_cast;
    /* format('%I') quotes type names that are keywords: pg_catalog."numeric", "varchar", "time",
     * "timestamp". A quoted name with a quote inside is no built-in type: it stays as it is. */
    char unquoted[64];
    size_t len = strlen(typname);
    if (len >= 2 && len < sizeof(unquoted) && typname[0] == '"' && typname[len - 1] == '"' &&
        memchr(typname + 1, '"', len - 2) == NULL) {
        memcpy(unquoted, typname + 1, len - 2);
        unquoted[len - 2] = '\0';
        typname = unquoted;
    }
    return !ces_types_compatible(typname, mapped);
}

uint64_t ces_tableplan_upsert_attempts(unsigned taken_before) {
    unsigned doublings = taken_before < CES_TABLEPLAN_UPSERT_MAX_DOUBLINGS
                             ? taken_before
                             : CES_TABLEPLAN_UPSERT_MAX_DOUBLINGS;
    return (uint64_t)CES_TABLEPLAN_UPSERT_ATTEMPTS << doublings;
}
