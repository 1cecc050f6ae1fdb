/*
 * columns: a table rule's choice of columns, made on the event (columns.h).
 */
#include "apply/columns.h"

#include <string.h>
#include <strings.h>

bool ces_columns_any(const ces_columns_rule_t *r) {
    return r->ninclude > 0 || r->nexclude > 0 || r->nrename > 0;
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

static void apply_fields(const ces_columns_rule_t *r, ces_field_t *fields, size_t *n) {
    size_t out = 0;
    for (size_t i = 0; i < *n; i++) {
        if (!kept(r, fields[i].name))
            continue;
        fields[out] = fields[i];
        const char *to = renamed(r, fields[i].name);
        if (to != NULL) {
            fields[out].name = to;
            fields[out].name_len = (uint32_t)strlen(to);
        }
        out++;
    }
    *n = out;
}

int ces_columns_apply(const ces_columns_rule_t *r, ces_event_t *ev, bool keys_needed,
                      const char **key_column) {
    for (size_t i = 0; keys_needed && i < ev->npkkey; i++) {
        if (!kept(r, ev->pkkey[i].name)) {
            *key_column = ev->pkkey[i].name;
            return 1;
        }
    }
    size_t out = 0;
    for (size_t i = 0; i < ev->ncols; i++) {
        if (!kept(r, ev->cols[i].name))
            continue;
        ev->cols[out] = ev->cols[i];
        const char *to = renamed(r, ev->cols[i].name);
        if (to != NULL) {
            ev->cols[out].name = to;
            ev->cols[out].name_len = (uint32_t)strlen(to);
        }
        out++;
    }
    ev->ncols = out;
    apply_fields(r, ev->pkkey, &ev->npkkey);
    apply_fields(r, ev->current, &ev->ncurrent);
    apply_fields(r, ev->old, &ev->nold);
    return 0;
}
