#include "apply/bulk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/map.h"

/* PostgreSQL's binary array format (array_recv): a header, then each element's length (-1:
 * NULL) and bytes. */
#define ARRAY_HEADER_BYTES 20
#define ARRAY_ELEMENT_HEADER_BYTES 4
#define PG_TEXT_OID 25
#define BINARY_FORMAT 1

typedef struct {
    ces_catalog_table_t *t;
    ces_bulk_kind_t kind;
    uintptr_t generation;
    char *sig;
    size_t sig_len;
    long *cols; /* upserts: target columns of the values, sorted */
    size_t ncols;
    size_t nvalues;      /* per row: a history row's own values, ncols (or the key columns), the
                          * version when guarded, and a soft delete's commit time */
    const char **values; /* nrows * nvalues, row after row; NULL is SQL NULL */
    int *lengths;
    size_t nrows;
    size_t values_rows, lengths_rows; /* rows values and lengths have room for */
    size_t bytes; /* value bytes gathered */
} group_t;

struct ces_bulk_s {
    ces_bulk_send_t send;
    void *opaque;
    group_t *groups;
    size_t ngroups;
    size_t groups_capacity;
    ces_map_t *keys; /* table id and key of every row waiting -> its last generation + 1 */
    uintptr_t generations; /* in use: 0..generations-1 */
    char *key;             /* scratch: the key being looked up */
    size_t key_capacity;
    char *sig; /* scratch: the signature being looked up */
    size_t sig_capacity;
};

/* Appends ",<v>" in decimal (formatted by hand: this runs for every column of every change). */
static size_t put_number(char *buf, unsigned long v) {
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    buf[0] = ',';
    for (size_t i = 0; i < n; i++)
        buf[1 + i] = digits[n - 1 - i];
    return n + 1;
}

size_t ces_bulk_signature(char *buf, size_t size, ces_bulk_kind_t kind, unsigned table_id,
                          const long *cols, size_t n) {
    buf[0] = (char)kind;
    size_t len = 1 + put_number(buf + 1, table_id);
    for (size_t i = 0; i < n && len + 12 < size; i++)
        len += put_number(buf + len, (unsigned long)cols[i]);
    return len;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes value number j of every row of g as one text[] at p; returns the end. */
static unsigned char *put_array(unsigned char *p, const group_t *g, size_t j) {
    size_t nv = g->nvalues;
    bool has_null = false;
    for (size_t r = 0; r < g->nrows && !has_null; r++)
        has_null = g->values[r * nv + j] == NULL;
    put_be32(p, 1);                 /* dimensions */
    put_be32(p + 4, has_null);      /* flags */
    put_be32(p + 8, PG_TEXT_OID);   /* element type */
    put_be32(p + 12, (uint32_t)g->nrows);
    put_be32(p + 16, 1);            /* lower bound */
    p += ARRAY_HEADER_BYTES;
    for (size_t r = 0; r < g->nrows; r++) {
        const char *v = g->values[r * nv + j];
        uint32_t len = (uint32_t)g->lengths[r * nv + j];
        put_be32(p, v == NULL ? UINT32_MAX : len);
        p += ARRAY_ELEMENT_HEADER_BYTES;
        if (v != NULL) {
            memcpy(p, v, len);
            p += len;
        }
    }
    return p;
}

/* Sends the rows of group g as one statement and empties it. Each parameter is a text[] in
 * PostgreSQL's binary array format, so no value needs quoting or escaping. */
static ces_bulk_status_t send_group(ces_bulk_t *b, group_t *g) {
    if (g->nrows == 0)
        return CES_BULK_OK;
    ces_bulk_status_t rc = CES_BULK_NOMEM;
    size_t nv = g->nvalues;
    size_t total =
        nv * ARRAY_HEADER_BYTES + g->nrows * nv * ARRAY_ELEMENT_HEADER_BYTES + g->bytes;
    unsigned char *buf = malloc(total);
    const char **params = malloc(nv * sizeof(*params));
    int *plens = malloc(nv * sizeof(*plens));
    int *formats = malloc(nv * sizeof(*formats));
    if (buf == NULL || params == NULL || plens == NULL || formats == NULL)
        goto done;
    unsigned char *p = buf;
    for (size_t j = 0; j < nv; j++) {
        unsigned char *end = put_array(p, g, j);
        params[j] = (const char *)p;
        plens[j] = (int)(end - p);
        formats[j] = BINARY_FORMAT;
        p = end;
    }
    ces_bulk_statement_t stmt = {.kind = g->kind,
                                 .table = g->t,
                                 .sig = g->sig,
                                 .sig_len = g->sig_len,
                                 .cols = g->cols,
                                 .ncols = g->ncols,
                                 .nparams = (int)nv,
                                 .values = params,
                                 .lengths = plens,
                                 .formats = formats};
    rc = b->send(b->opaque, &stmt) == 0 ? CES_BULK_OK : CES_BULK_SEND_FAILED;
    g->nrows = 0;
    g->bytes = 0;
done:
    free(buf);
    free(params);
    free(plens);
    free(formats);
    return rc;
}

ces_bulk_status_t ces_bulk_flush(ces_bulk_t *b) {
    for (uintptr_t gen = 0; gen < b->generations; gen++) {
        for (size_t i = 0; i < b->ngroups; i++) {
            if (b->groups[i].generation != gen)
                continue;
            ces_bulk_status_t rc = send_group(b, &b->groups[i]);
            if (rc != CES_BULK_OK)
                return rc;
        }
    }
    b->generations = 0;
    if (b->keys != NULL)
        ces_map_clear(b->keys, NULL, NULL);
    return CES_BULK_OK;
}

/* The group of kind and signature sig (made when new); NULL when out of memory. */
static group_t *find_group(ces_bulk_t *b, ces_bulk_kind_t kind, uintptr_t generation,
                           ces_catalog_table_t *t, const char *sig, size_t sig_len,
                           const long *cols, size_t ncols, size_t nvalues) {
    for (size_t i = 0; i < b->ngroups; i++) {
        group_t *g = &b->groups[i];
        if (g->generation == generation && g->kind == kind && g->sig_len == sig_len &&
            memcmp(g->sig, sig, sig_len) == 0)
            return g;
    }
    group_t *groups = CES_ARRAY_RESERVE(b->groups, b->groups_capacity, b->ngroups + 1, 8);
    if (groups == NULL)
        return NULL;
    b->groups = groups;
    group_t *g = &b->groups[b->ngroups];
    *g = (group_t){.t = t,
                   .kind = kind,
                   .generation = generation,
                   .sig_len = sig_len,
                   .ncols = ncols,
                   .nvalues = nvalues};
    g->sig = malloc(sig_len);
    g->cols = malloc((ncols + 1) * sizeof(*g->cols));
    if (g->sig == NULL || g->cols == NULL) {
        free(g->sig);
        free(g->cols);
        return NULL;
    }
    memcpy(g->sig, sig, sig_len);
    if (cols != NULL)
        memcpy(g->cols, cols, ncols * sizeof(*cols));
    b->ngroups++;
    return g;
}

ces_bulk_t *ces_bulk_new(ces_bulk_send_t send, void *opaque) {
    ces_bulk_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->send = send;
    b->opaque = opaque;
    return b;
}

void ces_bulk_destroy(ces_bulk_t *b) {
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->ngroups; i++) {
        free(b->groups[i].sig);
        free(b->groups[i].cols);
        free(b->groups[i].values);
        free(b->groups[i].lengths);
    }
    free(b->groups);
    free(b->key);
    free(b->sig);
    ces_map_destroy(b->keys);
    free(b);
}

/* Grows a scratch buffer to need bytes (need > 0). */
static int reserve(char **buf, size_t *capacity, size_t need) {
    char *grown = CES_ARRAY_RESERVE(*buf, *capacity, need, 64);
    if (grown == NULL)
        return -1;
    *buf = grown;
    return 0;
}

int ces_bulk_reserve_signature(char **buf, size_t *capacity, size_t n) {
    return reserve(buf, capacity, CES_BULK_SIGNATURE_SIZE(n));
}

/* The generation a change of the key in values[key_slots] goes to: the one after the key's last
 * change waiting. Sends everything first when that would pass CES_BULK_MAX_GENERATIONS. */
static ces_bulk_status_t key_generation(ces_bulk_t *b, const ces_catalog_desc_t *t,
                                        const char *const *values, const int *lengths,
                                        const size_t *key_slots, uintptr_t *generation) {
    size_t need = sizeof(t->id);
    for (size_t k = 0; k < t->npk; k++)
        need += sizeof(uint32_t) + (size_t)lengths[key_slots[k]];
    if (reserve(&b->key, &b->key_capacity, need) != 0)
        return CES_BULK_NOMEM;
    memcpy(b->key, &t->id, sizeof(t->id));
    size_t kl = sizeof(t->id);
    for (size_t k = 0; k < t->npk; k++) {
        uint32_t len = (uint32_t)lengths[key_slots[k]];
        memcpy(b->key + kl, &len, sizeof(len));
        if (len > 0)
            memcpy(b->key + kl + sizeof(len), values[key_slots[k]], len);
        kl += sizeof(len) + len;
    }
    if (b->keys == NULL && (b->keys = ces_map_new_scratch()) == NULL)
        return CES_BULK_NOMEM;
    uintptr_t gen = (uintptr_t)ces_map_get(b->keys, b->key, kl);
    if (gen >= CES_BULK_MAX_GENERATIONS) {
        ces_bulk_status_t rc = ces_bulk_flush(b);
        if (rc != CES_BULK_OK)
            return rc;
        gen = 0;
    }
    if (ces_map_put(b->keys, b->key, kl, (void *)(gen + 1)) != 0)
        return CES_BULK_NOMEM;
    if (gen >= b->generations)
        b->generations = gen + 1;
    *generation = gen;
    return CES_BULK_OK;
}

/* Room for one more row in g: a row is g->nvalues values (and lengths). */
static int reserve_row(group_t *g) {
    const char **values = ces_array_reserve(g->values, &g->values_rows, g->nrows + 1,
                                            g->nvalues * sizeof(*g->values), 64);
    if (values != NULL)
        g->values = values;
    int *lengths = ces_array_reserve(g->lengths, &g->lengths_rows, g->nrows + 1,
                                     g->nvalues * sizeof(*g->lengths), 64);
    if (lengths != NULL)
        g->lengths = lengths;
    return values == NULL || lengths == NULL ? -1 : 0;
}

ces_bulk_status_t ces_bulk_add(ces_bulk_t *b, ces_bulk_kind_t kind, ces_item_t *item,
                               ces_catalog_table_t *table, const long *cols, size_t n,
                               const char *const *values, const int *lengths,
                               const size_t *key_slots, bool plain_insert) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    bool guard = ces_catalog_guarded(t);
    /* History rows never meet: each change has its own version (a resent one is skipped by ON
     * CONFLICT DO NOTHING, in one statement too), so they need no key's generation. */
    uintptr_t generation = 0;
    ces_bulk_status_t rc = kind == CES_BULK_HISTORY
                               ? CES_BULK_OK
                               : key_generation(b, t, values, lengths, key_slots, &generation);
    if (rc != CES_BULK_OK)
        return rc;
    if (b->generations == 0)
        b->generations = 1;
    if (kind == CES_BULK_UPSERT && generation == 0 && plain_insert)
        kind = CES_BULK_INSERT;
    if (ces_bulk_reserve_signature(&b->sig, &b->sig_capacity, n) != 0)
        return CES_BULK_NOMEM;
    size_t sl = ces_bulk_signature(b->sig, b->sig_capacity, kind, t->id, cols, cols ? n : 0);
    /* A soft delete's row also carries the commit time it sets (NULL: now()). */
    bool stamp = kind == CES_BULK_DELETE && ces_catalog_soft_deletes(t);
    size_t own = kind == CES_BULK_HISTORY ? CES_CATALOG_HISTORY_NVALUES : 0;
    size_t nv = own + n + (guard ? 1 : 0) + (stamp ? 1 : 0);
    group_t *g = find_group(b, kind, generation, table, b->sig, sl, cols, n, nv);
    if (g == NULL || reserve_row(g) != 0)
        return CES_BULK_NOMEM;
    const char **row = g->values + g->nrows * nv;
    int *row_lengths = g->lengths + g->nrows * nv;
    for (size_t j = 0; j < own + n; j++) {
        row[j] = values[j];
        row_lengths[j] = row[j] ? lengths[j] : 0;
        g->bytes += (size_t)row_lengths[j];
    }
    n += own;
    if (guard) {
        char version[64];
        ces_version_format(&item->event.version, version, sizeof(version));
        size_t len = strlen(version);
        if ((row[n] = ces_arena_strndup(item->arena, version, len)) == NULL)
            return CES_BULK_NOMEM;
        row_lengths[n] = (int)len;
        g->bytes += len;
    }
    if (stamp) {
        row[nv - 1] = item->event.time;
        row_lengths[nv - 1] = row[nv - 1] ? (int)strlen(row[nv - 1]) : 0;
        g->bytes += (size_t)row_lengths[nv - 1];
    }
    g->nrows++;
    if (g->nrows >= CES_BULK_MAX_ROWS || g->bytes >= CES_BULK_MAX_BYTES)
        return ces_bulk_flush(b);
    return CES_BULK_OK;
}
