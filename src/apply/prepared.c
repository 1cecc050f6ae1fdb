#include "apply/prepared.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/sqltext.h"
#include "util/map.h"
#include "util/strbuf.h"

typedef struct {
    char *name;
    uint64_t epoch; /* the session epoch it was prepared in; 0: not prepared (its Parse failed) */
} stmt_t;

struct ces_prepared_s {
    ces_map_t *by_signature; /* signature -> stmt_t */
    unsigned next_id;
};

static void stmt_free(void *value, void *arg) {
    (void)arg;
    stmt_t *st = value;
    free(st->name);
    free(st);
}

ces_prepared_t *ces_prepared_new(void) {
    ces_prepared_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    if ((p->by_signature = ces_map_new()) == NULL) {
        free(p);
        return NULL;
    }
    return p;
}

void ces_prepared_destroy(ces_prepared_t *p) {
    if (p == NULL)
        return;
    ces_map_clear(p->by_signature, stmt_free, NULL);
    ces_map_destroy(p->by_signature);
    free(p);
}

static void build_statement(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                            ces_bulk_kind_t kind, const ces_catalog_desc_t *t, const long *cols,
                            size_t ncols) {
    switch (kind) {
    case CES_BULK_ROW_UPSERT:
        ces_sqltext_upsert(sql, names, t, cols, ncols, false);
        break;
    case CES_BULK_UPSERT:
        ces_sqltext_upsert(sql, names, t, cols, ncols, true);
        break;
    case CES_BULK_INSERT:
        ces_sqltext_insert(sql, names, t, cols, ncols, true);
        break;
    case CES_BULK_ROW_DELETE:
        ces_sqltext_delete(sql, names, t, false);
        break;
    case CES_BULK_DELETE:
        ces_sqltext_delete(sql, names, t, true);
        break;
    case CES_BULK_ROW_HISTORY:
        ces_sqltext_history(sql, t, cols, ncols, false);
        break;
    case CES_BULK_HISTORY:
        ces_sqltext_history(sql, t, cols, ncols, true);
        break;
    }
}

/* Sends the Parse of st's statement (kind on table, with ncols values). */
static int prepare(ces_inflight_t *inflight, const ces_metadata_t *metadata, stmt_t *st,
                   long item, ces_bulk_kind_t kind, const ces_catalog_desc_t *t, const long *cols,
                   size_t ncols) {
    ces_sqltext_names_t names = {.tombstones = ces_metadata_tombstones(metadata),
                                 .version = ces_metadata_version_quoted(metadata)};
    ces_strbuf_t sql = {0};
    build_statement(&sql, &names, kind, t, cols, ncols);
    if (sql.failed) {
        ces_strbuf_free(&sql);
        return ces_inflight_out_of_memory(inflight);
    }
    int ok = PQsendPrepare(ces_inflight_conn(inflight), st->name, sql.buf,
                           ces_sqltext_nparams(t, ncols), NULL);
    ces_strbuf_free(&sql);
    return ces_inflight_sent_parse(inflight, ok, item, &st->epoch);
}

/* The cache's entry for a signature, made when missing; NULL when out of memory. */
static stmt_t *lookup(ces_prepared_t *p, const char *sig, size_t sig_len) {
    stmt_t *st = ces_map_get(p->by_signature, sig, sig_len);
    if (st != NULL)
        return st;
    st = calloc(1, sizeof(*st));
    char name[32];
    snprintf(name, sizeof(name), "ces_%u", ++p->next_id);
    if (st == NULL || (st->name = strdup(name)) == NULL ||
        ces_map_put(p->by_signature, sig, sig_len, st) != 0) {
        if (st)
            free(st->name);
        free(st);
        return NULL;
    }
    return st;
}

const char *ces_prepared_get(ces_prepared_t *p, ces_inflight_t *inflight,
                             const ces_metadata_t *metadata, const char *sig, size_t sig_len,
                             long item, ces_bulk_kind_t kind, const ces_catalog_desc_t *t,
                             const long *cols, size_t ncols) {
    stmt_t *st = lookup(p, sig, sig_len);
    if (st == NULL) {
        ces_inflight_out_of_memory(inflight);
        return NULL;
    }
    if (st->epoch != ces_inflight_epoch(inflight) &&
        prepare(inflight, metadata, st, item, kind, t, cols, ncols) != 0)
        return NULL;
    return st->name;
}
