#include "apply/sender.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "apply/bulk.h"
#include "format/types.h"
#include "util/array.h"
#include "util/log.h"

struct ces_sender_s {
    ces_inflight_t *inflight;
    ces_prepared_t *prepared;
    const ces_metadata_t *metadata;
    bool bulk;
    bool plain_inserts;
    uint64_t attempt;
    ces_bulk_t *gathered;
    /* scratch for one statement's parameters */
    const char **values;
    int *lengths;
    long *cols;
    const ces_field_t **fields;
    size_t values_capacity, lengths_capacity, cols_capacity, fields_capacity;
    unsigned *marks; /* per target column: == mark when the statement being built has it */
    size_t marks_capacity;
    unsigned mark;
    char *sig; /* the statement signature being built */
    size_t sig_capacity;
    char version[64];
    /* The last upsert's columns, by its event's shape (the names of its column list and images,
     * in order, which alone decide them): a table's events nearly always repeat a shape, so the
     * names of an event of the last shape need not be resolved again. The shape is the batch's
     * (an event's compact copy), and the sender lives for one attempt, in which no table
     * changes. from[j]: the field for column cols[j], in current, or at ncurrent + k in pkkey. */
    struct {
        const ces_catalog_table_t *table;
        const char *shape; /* names only: the counts tell where each list starts */
        size_t shape_len;
        size_t ncols, npkkey, ncurrent, nold;
        size_t n;
        long *cols;
        uint32_t *from;
        size_t cols_capacity, from_capacity;
    } recipe;
};

/* The parameter scratch's first size: more columns than most tables have. */
#define SCRATCH_FIRST 32

static int out_of_memory(ces_sender_t *s) { return ces_inflight_out_of_memory(s->inflight); }

/* ---------------------------------------------------------------------------------------------- */
/* Statements                                                                                     */

/* The bulk gatherer's send callback. */
static int send_bulk_statement(void *opaque, const ces_bulk_statement_t *b) {
    ces_sender_t *s = opaque;
    const char *name =
        ces_prepared_get(s->prepared, s->inflight, s->metadata, b->sig, b->sig_len, -1, b->kind,
                         ces_catalog_desc(b->table), b->cols, b->ncols);
    if (name == NULL)
        return -1;
    int ok = PQsendQueryPrepared(ces_inflight_conn(s->inflight), name, b->nparams, b->values,
                                 b->lengths, b->formats, 0);
    if (b->kind == CES_BULK_INSERT)
        return ces_inflight_sent_insert(s->inflight, ok, b->table);
    return ces_inflight_sent(s->inflight, ok, CES_INFLIGHT_BULK, -1);
}

static int bulk_outcome(ces_sender_t *s, ces_bulk_status_t rc) {
    if (rc == CES_BULK_NOMEM)
        out_of_memory(s);
    return rc == CES_BULK_OK ? 0 : -1;
}

int ces_sender_flush_bulk(ces_sender_t *s) { return bulk_outcome(s, ces_bulk_flush(s->gathered)); }

/* ---------------------------------------------------------------------------------------------- */
/* Row changes                                                                                    */

/* Room in the parameter scratch for n values (n > 0). */
static int reserve_scratch(ces_sender_t *s, size_t n) {
    const char **v = CES_ARRAY_RESERVE(s->values, s->values_capacity, n, SCRATCH_FIRST);
    if (v)
        s->values = v;
    int *l = CES_ARRAY_RESERVE(s->lengths, s->lengths_capacity, n, SCRATCH_FIRST);
    if (l)
        s->lengths = l;
    long *c = CES_ARRAY_RESERVE(s->cols, s->cols_capacity, n, SCRATCH_FIRST);
    if (c)
        s->cols = c;
    const ces_field_t **f = CES_ARRAY_RESERVE(s->fields, s->fields_capacity, n, SCRATCH_FIRST);
    if (f)
        s->fields = f;
    if (!v || !l || !c || !f)
        return out_of_memory(s);
    return 0;
}

/* Converts a value for its column into parameter slot; NULL values stay NULL. Returns -1 when out
 * of memory. */
static int param_value(ces_sender_t *s, ces_item_t *item, const ces_catalog_desc_t *t, long col,
                       const ces_field_t *f, size_t slot) {
    if (f->is_null) {
        s->values[slot] = NULL;
        s->lengths[slot] = 0;
        return 0;
    }
    size_t len;
    const char *v = ces_types_convert(t->cols[col].conv, f->value, f->value_len, item->arena, &len);
    if (v == NULL) {
        out_of_memory(s);
        return -1;
    }
    s->values[slot] = v;
    s->lengths[slot] = (int)len;
    return 0;
}

/* Key value of pk column k: from the image (if given), else from pkkey. */
static const ces_field_t *key_field(ces_catalog_table_t *table, size_t k, const ces_field_t *image,
                                    size_t nimage, const ces_event_t *ev) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    for (size_t i = 0; i < nimage; i++) {
        if (ces_catalog_resolve_column(table, image[i].name) == (long)t->pk[k])
            return &image[i];
    }
    for (size_t i = 0; i < ev->npkkey; i++) {
        if (ces_catalog_resolve_column(table, ev->pkkey[i].name) == (long)t->pk[k])
            return &ev->pkkey[i];
    }
    return NULL;
}

/* Adds the event's version as parameter slot (when the table is guarded). Returns the number of
 * parameters. */
static int add_version_param(ces_sender_t *s, const ces_catalog_desc_t *t, const ces_event_t *ev,
                             size_t slot) {
    if (!ces_catalog_guarded(t))
        return (int)slot;
    ces_version_format(&ev->version, s->version, sizeof(s->version));
    s->values[slot] = s->version;
    s->lengths[slot] = 0;
    return (int)slot + 1;
}

/* Why a change without a value for a key column cannot be applied. */
#define MISSING_KEY_VALUE "the event lacks a value for a primary key column of the target table"

/* Sends a row statement of kind on the values s->values[0..n) of the columns cols (NULL for a
 * delete); a history row's values follow its own CES_CATALOG_HISTORY_NVALUES. */
static int send_row(ces_sender_t *s, long idx, const ces_event_t *ev, ces_bulk_kind_t kind,
                    const ces_catalog_desc_t *t, const long *cols, size_t n) {
    if (ces_bulk_reserve_signature(&s->sig, &s->sig_capacity, n) != 0) {
        out_of_memory(s);
        return -1;
    }
    size_t sl = ces_bulk_signature(s->sig, s->sig_capacity, kind, t->id, cols, cols ? n : 0);
    const char *name =
        ces_prepared_get(s->prepared, s->inflight, s->metadata, s->sig, sl, idx, kind, t, cols, n);
    if (name == NULL)
        return -1;
    size_t nvalues = n + (kind == CES_BULK_ROW_HISTORY ? CES_CATALOG_HISTORY_NVALUES : 0);
    int nparams = add_version_param(s, t, ev, nvalues);
    if (kind == CES_BULK_ROW_DELETE && ces_catalog_soft_deletes(t)) {
        s->values[nparams] = ev->time; /* the commit time a soft delete sets; NULL: now() */
        s->lengths[nparams++] = 0;
    }
    return ces_inflight_sent(s->inflight,
                             PQsendQueryPrepared(ces_inflight_conn(s->inflight), name, nparams,
                                                 s->values, s->lengths, NULL, 0),
                             CES_INFLIGHT_ROW, idx);
}

static int send_delete(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                       const ces_field_t *image, size_t nimage, bool bulk, ces_reject_t *reject) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    if (reserve_scratch(s, t->npk + 2) != 0) /* the key, the version, a soft delete's time */
        return -1;
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *f = key_field(table, k, image, nimage, &item->event);
        if (f == NULL || f->is_null) {
            *reject = (ces_reject_t){CES_DL_SCHEMA, MISSING_KEY_VALUE};
            return 0;
        }
        if (param_value(s, item, t, (long)t->pk[k], f, k) != 0)
            return -1;
    }
    if (bulk) {
        size_t key_slots[t->npk + 1];
        for (size_t k = 0; k < t->npk; k++)
            key_slots[k] = k;
        return bulk_outcome(s, ces_bulk_add(s->gathered, CES_BULK_DELETE, item, table, NULL,
                                            t->npk, s->values, s->lengths, key_slots, false));
    }
    return send_row(s, idx, &item->event, CES_BULK_ROW_DELETE, t, NULL, t->npk);
}

/* Starts a new set of column marks for table t (a column is in the set when marks[col] == mark). */
static int new_marks(ces_sender_t *s, const ces_catalog_desc_t *t) {
    if (t->ncols > s->marks_capacity) {
        size_t had = s->marks_capacity;
        unsigned *m = CES_ARRAY_RESERVE(s->marks, s->marks_capacity, t->ncols, SCRATCH_FIRST);
        if (m == NULL)
            return out_of_memory(s);
        memset(m + had, 0, (s->marks_capacity - had) * sizeof(*m));
        s->marks = m;
    }
    if (++s->mark == 0) { /* wrapped: old marks could look current */
        memset(s->marks, 0, s->marks_capacity * sizeof(*s->marks));
        s->mark = 1;
    }
    return 0;
}

/* Gathers into s->cols and s->fields the upsert's columns: those of the new image (the first of
 * names that fold alike), then key columns it lacks (from pkkey), sorted by column index. Returns
 * the count, 0 with *reject set when a key value is missing, or -1. */
static bool recipe_fits(const ces_sender_t *s, const ces_catalog_table_t *table,
                        const ces_event_t *ev) {
    return ev->shape != NULL && s->recipe.table == table && s->recipe.shape_len == ev->shape_len &&
           s->recipe.ncols == ev->ncols && s->recipe.npkkey == ev->npkkey &&
           s->recipe.ncurrent == ev->ncurrent && s->recipe.nold == ev->nold &&
           memcmp(s->recipe.shape, ev->shape, ev->shape_len) == 0;
}

/* Remembers the columns just gathered for events of ev's shape; without memory, nothing. */
static void recipe_keep(ces_sender_t *s, const ces_catalog_table_t *table, const ces_event_t *ev,
                        size_t n) {
    s->recipe.table = NULL;
    if (ev->shape == NULL)
        return;
    long *cols = CES_ARRAY_RESERVE(s->recipe.cols, s->recipe.cols_capacity, n, SCRATCH_FIRST);
    if (cols != NULL)
        s->recipe.cols = cols;
    uint32_t *from = CES_ARRAY_RESERVE(s->recipe.from, s->recipe.from_capacity, n, SCRATCH_FIRST);
    if (from != NULL)
        s->recipe.from = from;
    if (cols == NULL || from == NULL)
        return;
    for (size_t j = 0; j < n; j++) {
        /* Every field is in current or in pkkey; which one, told by address (as integers: C
         * orders only pointers into one array). */
        uintptr_t at = (uintptr_t)s->fields[j], current = (uintptr_t)ev->current;
        s->recipe.cols[j] = s->cols[j];
        s->recipe.from[j] = at - current < ev->ncurrent * sizeof(ces_field_t)
                                ? (uint32_t)(s->fields[j] - ev->current)
                                : (uint32_t)(ev->ncurrent + (size_t)(s->fields[j] - ev->pkkey));
    }
    s->recipe.table = table;
    s->recipe.shape = ev->shape;
    s->recipe.shape_len = ev->shape_len;
    s->recipe.ncols = ev->ncols;
    s->recipe.npkkey = ev->npkkey;
    s->recipe.ncurrent = ev->ncurrent;
    s->recipe.nold = ev->nold;
    s->recipe.n = n;
}

/* Column order decides the statement: sorts cols[0..n) (and their fields) by column index so that
 * equal shapes share one (events list their columns in table order, so this is mostly one pass). */
static void sort_by_column(long *cols, const ces_field_t **fields, size_t n) {
    for (size_t i = 1; i < n; i++) {
        long c = cols[i];
        const ces_field_t *f = fields[i];
        size_t j = i;
        for (; j > 0 && cols[j - 1] > c; j--) {
            cols[j] = cols[j - 1];
            fields[j] = fields[j - 1];
        }
        cols[j] = c;
        fields[j] = f;
    }
}

static long upsert_columns(ces_sender_t *s, ces_catalog_table_t *table, const ces_event_t *ev,
                           ces_reject_t *reject) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    const ces_field_t **fields = s->fields;
    size_t n = 0;
    if (recipe_fits(s, table, ev)) {
        for (size_t j = 0; j < s->recipe.n; j++) {
            uint32_t from = s->recipe.from[j];
            s->cols[j] = s->recipe.cols[j];
            fields[j] = from < ev->ncurrent ? &ev->current[from] : &ev->pkkey[from - ev->ncurrent];
        }
        return (long)s->recipe.n;
    }
    if (new_marks(s, t) != 0)
        return -1;
    for (size_t i = 0; i < ev->ncurrent; i++) {
        long col = ces_catalog_resolve_column(table, ev->current[i].name);
        if (col < 0 || s->marks[col] == s->mark)
            continue; /* a duplicate after case folding: the first wins */
        s->marks[col] = s->mark;
        s->cols[n] = col;
        fields[n++] = &ev->current[i];
    }
    for (size_t k = 0; k < t->npk; k++) {
        if (s->marks[t->pk[k]] == s->mark)
            continue;
        const ces_field_t *f = key_field(table, k, NULL, 0, ev);
        if (f == NULL) {
            *reject = (ces_reject_t){CES_DL_SCHEMA, MISSING_KEY_VALUE};
            return 0;
        }
        s->cols[n] = (long)t->pk[k];
        fields[n++] = f;
    }
    sort_by_column(s->cols, fields, n);
    recipe_keep(s, table, ev, n);
    return (long)n;
}

static int send_upsert(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                       bool bulk, ces_reject_t *reject) {
    const ces_event_t *ev = &item->event;
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    if (reserve_scratch(s, ev->ncurrent + t->npk + 1) != 0)
        return -1;
    long counted = upsert_columns(s, table, ev, reject);
    if (counted < 0 || reject->reason != NULL)
        return counted < 0 ? -1 : 0;
    size_t n = (size_t)counted;
    for (size_t i = 0; i < n; i++) {
        if (param_value(s, item, t, s->cols[i], s->fields[i], i) != 0)
            return -1;
    }
    if (!bulk)
        return send_row(s, idx, ev, CES_BULK_ROW_UPSERT, t, s->cols, n);
    size_t key_slots[t->npk + 1];
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < t->npk; k++) {
            if ((size_t)s->cols[i] == t->pk[k])
                key_slots[k] = i;
        }
    }
    bool plain_insert = ev->op == CES_OP_INSERT && s->plain_inserts &&
                        ces_catalog_plain_inserts(table, s->attempt);
    return bulk_outcome(s, ces_bulk_add(s->gathered, CES_BULK_UPSERT, item, table, s->cols, n,
                                        s->values, s->lengths, key_slots, plain_insert));
}

/* True when an UPD moves the row: its old image holds a different primary key than the new one. */
static bool key_changed(ces_catalog_table_t *table, const ces_event_t *ev) {
    if (ev->op != CES_OP_UPDATE || ev->nold == 0)
        return false;
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *o = NULL;
        for (size_t i = 0; i < ev->nold && o == NULL; i++) {
            if (ces_catalog_resolve_column(table, ev->old[i].name) == (long)t->pk[k])
                o = &ev->old[i];
        }
        const ces_field_t *n = key_field(table, k, ev->current, ev->ncurrent, ev);
        if (o == NULL || n == NULL || o->is_null || n->is_null)
            return false;
        if (o->value_len != n->value_len || memcmp(o->value, n->value, o->value_len) != 0)
            return true;
    }
    return false;
}

/* A history row's own values (CES_CATALOG_HISTORY_META) into s->values[0..5): its version,
 * operation, commit LSN, sequence number and commit time, formatted into the item's arena, where
 * a bulk statement may reference them until it is sent. Returns 0, or -1 when out of memory. */
static int history_own_values(ces_sender_t *s, ces_item_t *item) {
    enum { VERSION = 64, LSN = 23, SEQUENCE = 24 };
    const ces_event_t *ev = &item->event;
    char *buf = ces_arena_alloc(item->arena, VERSION + LSN + SEQUENCE);
    if (buf == NULL)
        return out_of_memory(s);
    ces_version_format(&ev->version, buf, VERSION);
    ces_lsn_format(ev->version.commit_lsn, buf + VERSION);
    snprintf(buf + VERSION + LSN, SEQUENCE, "%llu", (unsigned long long)ev->version.sequence);
    const char *values[] = {buf, ces_op_name(ev->op), buf + VERSION, buf + VERSION + LSN, ev->time};
    for (size_t i = 0; i < CES_CATALOG_HISTORY_NVALUES; i++) {
        s->values[i] = values[i];
        s->lengths[i] = values[i] != NULL ? (int)strlen(values[i]) : 0;
    }
    return 0;
}

/*
 * Appends the change to the history table h: its version, operation, commit LSN, sequence and
 * time, and its row image (the new row; the old one for a delete, or its key when the source sends
 * no old image), in bulk statements or row by row.
 */
static int send_history(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *h) {
    const ces_event_t *ev = &item->event;
    const ces_catalog_desc_t *t = ces_catalog_desc(h);
    const ces_field_t *image = ev->current;
    size_t nimage = ev->ncurrent;
    if (ev->op == CES_OP_DELETE) {
        image = ev->nold > 0 ? ev->old : ev->pkkey;
        nimage = ev->nold > 0 ? ev->nold : ev->npkkey;
    }
    const size_t meta = CES_CATALOG_HISTORY_NVALUES;
    if (reserve_scratch(s, meta + nimage) != 0 || new_marks(s, t) != 0)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < nimage; i++) {
        long col = ces_catalog_resolve_column(h, image[i].name);
        if (col < 0 || s->marks[col] == s->mark)
            continue; /* a duplicate after case folding: the first wins */
        s->marks[col] = s->mark;
        s->cols[n] = col;
        s->fields[n++] = &image[i];
    }
    sort_by_column(s->cols, s->fields, n);
    for (size_t i = 0; i < n; i++) {
        if (param_value(s, item, t, s->cols[i], s->fields[i], meta + i) != 0)
            return -1;
    }
    if (history_own_values(s, item) != 0)
        return -1;
    if (s->bulk)
        return bulk_outcome(s, ces_bulk_add(s->gathered, CES_BULK_HISTORY, item, h, s->cols, n,
                                            s->values, s->lengths, NULL, false));
    return send_row(s, idx, ev, CES_BULK_ROW_HISTORY, t, s->cols, n);
}

/* The change itself, to the table's target table. */
static int send_mirror(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                       ces_reject_t *reject) {
    const ces_event_t *ev = &item->event;
    if (ev->op == CES_OP_DELETE)
        return send_delete(s, idx, item, table, ev->old, ev->nold, s->bulk, reject);
    if (ev->op == CES_OP_UPDATE && ev->nold == 0 && ces_catalog_note_no_old_image(table)) {
        /* include_old_values = 0 at the source: a changed key cannot be told from the new row. */
        ces_log_warning("table %s: UPD events carry no old row image (include_old_values = 0): "
                        "if a primary key is changed at the source, the row is upserted under "
                        "its new key and the row under the old key stays",
                        ces_catalog_desc(table)->qualified);
    }
    if (key_changed(table, ev)) {
        /* A move touches two keys: it goes row by row, after whatever waits for either. */
        if (ces_sender_flush_bulk(s) != 0)
            return -1;
        if (send_delete(s, idx, item, table, ev->old, ev->nold, false, reject) != 0 ||
            reject->reason != NULL)
            return reject->reason != NULL ? 0 : -1;
        return send_upsert(s, idx, item, table, false, reject);
    }
    return send_upsert(s, idx, item, table, s->bulk, reject);
}

int ces_sender_event(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                     ces_reject_t *reject) {
    if (ces_catalog_mirrored(table) &&
        (send_mirror(s, idx, item, table, reject) != 0 || reject->reason != NULL))
        return reject->reason != NULL ? 0 : -1;
    ces_catalog_table_t *h = ces_catalog_history(table);
    return h != NULL ? send_history(s, idx, item, h) : 0;
}


/* ---------------------------------------------------------------------------------------------- */

ces_sender_t *ces_sender_new(const ces_sender_options_t *o) {
    ces_sender_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->inflight = o->inflight;
    s->prepared = o->prepared;
    s->metadata = o->metadata;
    s->bulk = o->bulk;
    s->plain_inserts = o->plain_inserts;
    s->attempt = o->attempt;
    if ((s->gathered = ces_bulk_new(send_bulk_statement, s)) == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

void ces_sender_destroy(ces_sender_t *s) {
    if (s == NULL)
        return;
    ces_bulk_destroy(s->gathered);
    free(s->values);
    free(s->lengths);
    free(s->cols);
    free(s->fields);
    free(s->marks);
    free(s->sig);
    free(s->recipe.cols);
    free(s->recipe.from);
    free(s);
}
