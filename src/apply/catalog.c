#include "apply/catalog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/pgcatalog.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "apply/shapes.h"
#include "apply/tableplan.h"
#include "format/decode.h"
#include "util/log.h"
#include "util/map.h"
#include "util/strbuf.h"

/* Verdicts of type_checks. */
#define TYPE_FITS ((uintptr_t)1)
#define TYPE_CONFLICT ((uintptr_t)2)

struct ces_catalog_table_s {
    ces_catalog_desc_t desc;
    size_t capacity; /* of desc.cols */
    char *pg_schema;
    char *pg_table;
    ces_map_t *by_source; /* source column name -> index + 1 */
    bool loaded;          /* columns read from the catalog */
    /* The attempt (ces_catalog_ensure) that found it missing and could not create it; 0: none. */
    uint64_t absent_attempt;
    bool preserve_case;
    const char *version_column; /* reference to the catalog's */
    const char *deleted_column; /* the rule's soft-delete column (the configuration's); NULL */
    char *deleted_quoted;       /* ... quoted for DDL */
    const char *history_template; /* the rule's history table (the configuration's); NULL */
    bool history_only;            /* no mirror: the history table alone */
    bool is_history;              /* this is a history table (another table's history) */
    ces_columns_rule_t columns;   /* the rule's choice of columns (the configuration's strings) */
    int rule_line;
    struct ces_catalog_table_s *history; /* owned; made when first needed */
    /* The source's name as schema.target spells it ("dbo.Orders"), which the table's comment
     * carries when ces2pg made it; source_mark: what the comment says, NULL when no mark. */
    char *source;
    char *source_mark;
    /* Set when every event of the table is refused (a reserved target, a name collision). */
    ces_reject_t refused;
    char refused_reason[400];
    bool warned_renamed;
    bool warned_no_old_image;
    bool warned_no_pk;
    ces_map_t *type_checks; /* "column\x1ftype" -> verdict */
    /* The last event shapes that passed every check against this description (shapes.h);
     * emptied whenever the description is read again. */
    ces_shapes_t *shapes;
    char reject_reason[300];
    /* Inserts of new keys go as plain INSERTs from attempt number upsert_until on;
     * insert_conflicts counts the times one found its key taken. */
    uint64_t upsert_until;
    unsigned insert_conflicts;
};

struct ces_catalog_s {
    bool preserve_case;
    bool auto_create;
    bool auto_evolve;
    bool lsn_guard;
    char *target_schema; /* schema.target before its dot, e.g. "{schema}" */
    char *target_table;  /* ... and after it, e.g. "{table}" */
    char *version_column;
    char *metadata_schema;
    ces_map_t *tables; /* "db\x1fschema\x1ftable" -> ces_catalog_table_t */
    /* quoted "schema"."table" -> the source (malloc'd) that first found it in this process (see
     * table_owner); kept across ces_catalog_forget so that forgetting cannot let a second source
     * in. */
    ces_map_t *claims;
    unsigned next_table_id;
    ces_catalog_rule_fn rule_of;
    void *rule_opaque;
    ces_strbuf_t check_key; /* scratch: a type_checks key, grown to the longest seen */
    /* The table the last event resolved to, under its key (also where a key is built): events
     * come in runs of one table, and comparing the names beats building the key and hashing it.
     * Cleared with the tables. */
    ces_catalog_table_t *last;
    size_t last_klen;
    char last_key[3 * (CES_DECODE_MAX_NAME_BYTES + 1)];
};

/* ---------------------------------------------------------------------------------------------- */
/* Tables                                                                                         */

static void table_free(void *value, void *arg) {
    (void)arg;
    ces_catalog_table_t *t = value;
    if (t == NULL)
        return;
    ces_pgcatalog_desc_free(&t->desc);
    free(t->desc.qualified);
    ces_map_destroy(t->by_source);
    ces_map_destroy(t->type_checks);
    ces_shapes_destroy(t->shapes);
    free(t->pg_schema);
    free(t->pg_table);
    free(t->source);
    free(t->source_mark);
    free(t->deleted_quoted);
    ces_mask_destroy(t->columns.hasher);
    table_free(t->history, NULL);
    free(t);
}

static void claim_free(void *value, void *arg) {
    (void)arg;
    free(value);
}

ces_catalog_t *ces_catalog_new(const ces_catalog_options_t *o) {
    ces_catalog_t *cat = calloc(1, sizeof(*cat));
    if (cat == NULL)
        return NULL;
    cat->preserve_case = o->preserve_case;
    cat->auto_create = o->auto_create;
    cat->auto_evolve = o->auto_evolve;
    cat->lsn_guard = o->lsn_guard;
    cat->rule_of = o->rule_of;
    cat->rule_opaque = o->rule_opaque;
    const char *target = o->target ? o->target : "{schema}.{table}";
    const char *dot = strchr(target, '.');
    cat->target_schema = dot ? strndup(target, (size_t)(dot - target)) : strdup("public");
    cat->target_table = strdup(dot ? dot + 1 : target);
    cat->version_column = strdup(o->version_column ? o->version_column : "_ces_lsn");
    cat->metadata_schema = strdup(o->metadata_schema ? o->metadata_schema : "ces2pg");
    cat->tables = ces_map_new();
    cat->claims = ces_map_new();
    if (!cat->target_schema || !cat->target_table || !cat->version_column ||
        !cat->metadata_schema || !cat->tables || !cat->claims) {
        ces_catalog_destroy(cat);
        return NULL;
    }
    return cat;
}

void ces_catalog_destroy(ces_catalog_t *cat) {
    if (cat == NULL)
        return;
    if (cat->tables != NULL)
        ces_map_clear(cat->tables, table_free, NULL);
    ces_map_destroy(cat->tables);
    if (cat->claims != NULL)
        ces_map_clear(cat->claims, claim_free, NULL);
    ces_map_destroy(cat->claims);
    free(cat->metadata_schema);
    free(cat->target_schema);
    free(cat->target_table);
    free(cat->version_column);
    ces_strbuf_free(&cat->check_key);
    free(cat);
}

void ces_catalog_forget(ces_catalog_t *cat) {
    cat->last = NULL;
    ces_map_clear(cat->tables, table_free, NULL);
}

const ces_catalog_desc_t *ces_catalog_desc(const ces_catalog_table_t *t) { return &t->desc; }

bool ces_catalog_mirrored(const ces_catalog_table_t *t) { return !t->history_only; }

ces_catalog_table_t *ces_catalog_history(ces_catalog_table_t *t) { return t->history; }

bool ces_catalog_note_no_old_image(ces_catalog_table_t *t) {
    if (t->warned_no_old_image)
        return false;
    t->warned_no_old_image = true;
    return true;
}

bool ces_catalog_plain_inserts(const ces_catalog_table_t *t, uint64_t attempt) {
    return attempt >= t->upsert_until;
}

void ces_catalog_insert_taken(ces_catalog_table_t *t, uint64_t attempt) {
    t->upsert_until = attempt + ces_tableplan_upsert_attempts(t->insert_conflicts);
    t->insert_conflicts++;
}

long ces_catalog_resolve_column(ces_catalog_table_t *t, const char *source_name) {
    uintptr_t v = (uintptr_t)ces_map_get(t->by_source, source_name, strlen(source_name));
    if (v != 0)
        return (long)v - 1;
    bool renamed;
    char *f = ces_tableplan_column_name(source_name, t->preserve_case, t->version_column, &renamed);
    if (f == NULL)
        return -1;
    long idx = ces_tableplan_column_index(&t->desc, f);
    if (idx >= 0 && renamed && !t->warned_renamed) {
        ces_log_warning("table %s: source column '%s' has a name PostgreSQL or ces2pg reserves; "
                        "it is applied as column %s (other such columns alike)",
                        t->desc.qualified, source_name, f);
        t->warned_renamed = true;
    }
    free(f);
    if (idx >= 0)
        ces_map_put(t->by_source, source_name, strlen(source_name), (void *)(uintptr_t)(idx + 1));
    return idx;
}


/* Reads the table's columns and primary key from pg_catalog. Returns 1 when the table exists, 0
 * when it does not, -1 on error (in e). Whatever was known of the old description goes. */
static int table_load(const ces_catalog_t *cat, ces_session_t *session, ces_catalog_table_t *t,
                      ces_pgerr_t *e) {
    ces_map_clear(t->by_source, NULL, NULL);
    ces_map_clear(t->type_checks, NULL, NULL);
    ces_shapes_clear(t->shapes);
    return ces_pgcatalog_read(session, t->pg_schema, t->pg_table,
                              cat->lsn_guard && !t->is_history ? cat->version_column : NULL,
                              t->deleted_column,
                              &t->desc, &t->capacity, &t->source_mark, e);
}

/* The verdict on one (column, type), cached in t->type_checks; 0 when out of memory. Each
 * conflict is logged once. */
static uintptr_t column_verdict(ces_catalog_t *cat, ces_catalog_table_t *t, const ces_column_t *c) {
    /* The key is as long as the name and type are, never cut: a cut key could give one column's
     * verdict to another. */
    ces_strbuf_t *key = &cat->check_key;
    ces_strbuf_reset(key);
    ces_strbuf_add(key, c->name);
    ces_strbuf_add(key, "\x1f");
    ces_strbuf_add(key, c->type);
    if (key->failed)
        return 0;
    uintptr_t verdict = (uintptr_t)ces_map_get(t->type_checks, key->buf, key->len);
    if (verdict != 0)
        return verdict;
    long col = ces_catalog_resolve_column(t, c->name);
    const ces_catalog_column_t *target = col >= 0 ? &t->desc.cols[col] : NULL;
    verdict = target == NULL || !ces_tableplan_type_conflicts(target->cast, c->type)
                  ? TYPE_FITS
                  : TYPE_CONFLICT;
    if (verdict == TYPE_CONFLICT)
        ces_log_warning("table %s: type conflict: column %s is %s in PostgreSQL, but the "
                        "source now sends %s; its events go to the dead-letter table",
                        t->desc.qualified, target->name, target->type, c->type);
    if (ces_map_put(t->type_checks, key->buf, key->len, (void *)verdict) != 0)
        return 0;
    return verdict;
}

/*
 * A source column whose type no longer fits its target column (say int became nvarchar) is a type
 * conflict: columns are never retyped, so the event is dead-lettered. Verdicts are cached per
 * (column, type); an event of a shape that passed skips this (shape_known). *unchecked: memory
 * ran out before every column was judged.
 */
static bool type_conflict(ces_catalog_t *cat, ces_catalog_table_t *t, const ces_event_t *ev,
                          ces_reject_t *reject, bool *unchecked) {
    *unchecked = false;
    for (size_t i = 0; i < ev->ncols; i++) {
        const ces_column_t *c = &ev->cols[i];
        uintptr_t verdict = column_verdict(cat, t, c);
        if (verdict == 0) {
            *unchecked = true; /* out of memory: check again next time */
            return false;
        }
        if (verdict == TYPE_CONFLICT) {
            snprintf(t->reject_reason, sizeof(t->reject_reason),
                     "type conflict: source column '%.128s' is %.40s, which its target column "
                     "cannot hold (columns are never retyped)",
                     c->name, c->type);
            *reject = (ces_reject_t){CES_DL_TYPE_CONFLICT, t->reject_reason};
            return true;
        }
    }
    return false;
}

static bool fields_known(ces_catalog_table_t *t, const ces_field_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (ces_catalog_resolve_column(t, fields[i].name) < 0)
            return false;
    }
    return true;
}

static bool all_columns_known(ces_catalog_table_t *t, const ces_event_t *ev) {
    for (size_t i = 0; i < ev->ncols; i++) {
        if (ces_catalog_resolve_column(t, ev->cols[i].name) < 0)
            return false;
    }
    return fields_known(t, ev->pkkey, ev->npkkey) && fields_known(t, ev->current, ev->ncurrent) &&
           fields_known(t, ev->old, ev->nold);
}

/* Refuses every event of t (logged once per table): reason, of class cls. */
static void table_refuse(ces_catalog_table_t *t, const ces_event_t *ev, ces_dl_class_t cls,
                         const char *reason) {
    snprintf(t->refused_reason, sizeof(t->refused_reason), "%s", reason);
    t->refused = (ces_reject_t){cls, t->refused_reason};
    ces_log_warning("source table %s.%s.%s maps to %s: %s; its events go to the dead-letter table",
                    ev->db, ev->schema, ev->table, t->desc.qualified, reason);
}

/* Records that source owns the target table qualified (in place of what was recorded). Returns
 * -1 when out of memory. */
static int claim(ces_catalog_t *cat, const char *qualified, const char *source) {
    size_t qlen = strlen(qualified);
    char *copy = strdup(source);
    if (copy == NULL)
        return -1;
    free(ces_map_remove(cat->claims, qualified, qlen));
    if (ces_map_put(cat->claims, qualified, qlen, copy) != 0) {
        free(copy);
        return -1;
    }
    return 0;
}

static int nomem(ces_pgerr_t *e) {
    ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return -1;
}

/* Whether t's events may be applied at all, decided from names alone before any DDL or DML: not
 * to a reserved target (ces_tableplan_reserved_target). */
static void table_refusal(const ces_catalog_t *cat, ces_catalog_table_t *t,
                          const ces_event_t *ev) {
    const char *reserved =
        ces_tableplan_reserved_target(t->pg_schema, t->pg_table, cat->metadata_schema);
    if (reserved != NULL)
        table_refuse(t, ev, CES_DL_RESERVED_TARGET, reserved);
}

/*
 * Whether t, just read (or made), belongs to t's source (sets *reject when not): its comment names
 * the source that made it (a mark, which holds across restarts and processes, and outranks what
 * this process saw first), or, without one, the first source that found it in this process owns
 * it. Either way another source name that maps to the same table (a case-only difference folded
 * away) is refused. Returns -1 when refused or out of memory (then e is set).
 */
static int table_owner(ces_catalog_t *cat, ces_catalog_table_t *t, const ces_event_t *ev,
                       ces_reject_t *reject, ces_pgerr_t *e) {
    const char *owner = t->source_mark;
    bool marked = owner != NULL;
    if (owner == NULL)
        owner = ces_map_get(cat->claims, t->desc.qualified, strlen(t->desc.qualified));
    if (owner == NULL || strcmp(owner, t->source) == 0)
        return owner != NULL || claim(cat, t->desc.qualified, t->source) == 0 ? 0 : nomem(e);
    char reason[300];
    snprintf(reason, sizeof(reason),
             "name collision: the target table belongs to source '%.128s', whose name maps to "
             "the same PostgreSQL name%s",
             owner, marked ? " (its comment says so)" : "");
    table_refuse(t, ev, CES_DL_NAME_COLLISION, reason);
    *reject = t->refused;
    return -1;
}

/* A table named by template ("SCHEMA.TABLE" with placeholders; NULL: schema.target's parts) for
 * ev's source. */
static ces_catalog_table_t *table_make(ces_catalog_t *cat, const ces_session_t *session,
                                       const ces_event_t *ev, const char *template) {
    ces_catalog_table_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->desc.id = ++cat->next_table_id;
    t->desc.version_col = -1;
    t->desc.deleted_col = -1;
    t->by_source = ces_map_new();
    t->type_checks = ces_map_new();
    t->shapes = ces_shapes_new();
    t->preserve_case = cat->preserve_case;
    t->version_column = cat->version_column;
    char *schema, *table;
    if (template != NULL && strchr(template, '.') != NULL) {
        /* Checked when the configuration was read: SCHEMA.TABLE, one dot. */
        const char *dot = strchr(template, '.');
        char *schema_part = strndup(template, (size_t)(dot - template));
        schema = schema_part ? ces_tableplan_expand_target(schema_part, ev) : NULL;
        table = ces_tableplan_expand_target(dot + 1, ev);
        free(schema_part);
    } else {
        schema = ces_tableplan_expand_target(cat->target_schema, ev);
        table = ces_tableplan_expand_target(cat->target_table, ev);
    }
    t->pg_schema = schema ? ces_tableplan_fold_name(schema, cat->preserve_case) : NULL;
    t->pg_table = table ? ces_tableplan_fold_name(table, cat->preserve_case) : NULL;
    if (schema && table && (t->source = malloc(strlen(schema) + strlen(table) + 2)) != NULL)
        sprintf(t->source, "%s.%s", schema, table);
    free(schema);
    free(table);
    char *qs = t->pg_schema ? ces_session_quote(session, t->pg_schema) : NULL;
    char *qt = t->pg_table ? ces_session_quote(session, t->pg_table) : NULL;
    if (qs && qt && t->by_source && t->type_checks && t->shapes) {
        t->desc.qualified = malloc(strlen(qs) + strlen(qt) + 2);
        if (t->desc.qualified)
            sprintf(t->desc.qualified, "%s.%s", qs, qt);
    }
    free(qs);
    free(qt);
    if (t->desc.qualified == NULL || t->source == NULL) {
        table_free(t, NULL);
        return NULL;
    }
    return t;
}

/* The table of ev's source, as its rule (if any) says. */
static ces_catalog_table_t *table_new(ces_catalog_t *cat, const ces_session_t *session,
                                      const ces_event_t *ev) {
    ces_catalog_rule_t rule = {0};
    if (cat->rule_of != NULL)
        cat->rule_of(cat->rule_opaque, ev->schema, ev->table, &rule);
    ces_catalog_table_t *t = table_make(cat, session, ev, rule.target);
    if (t == NULL)
        return NULL;
    t->deleted_column = rule.deleted_column;
    if (t->deleted_column != NULL &&
        (t->deleted_quoted = ces_session_quote(session, t->deleted_column)) == NULL) {
        table_free(t, NULL);
        return NULL;
    }
    t->columns = rule.columns;
    t->columns.hasher = NULL;
    if (rule.mask_key != NULL && ces_columns_hash_masks(&rule.columns) &&
        (t->columns.hasher = ces_mask_new(rule.mask_key, strlen(rule.mask_key))) == NULL) {
        table_free(t, NULL);
        return NULL;
    }
    t->rule_line = rule.line;
    t->history_template = rule.history_table;
    t->history_only = rule.history_table != NULL && rule.history_only;
    if (!t->history_only) /* its name is never used otherwise */
        table_refusal(cat, t, ev);
    return t;
}

/* The history table of t, for ev's source. */
static ces_catalog_table_t *history_new(ces_catalog_t *cat, const ces_session_t *session,
                                        const ces_catalog_table_t *t, const ces_event_t *ev) {
    ces_catalog_table_t *h = table_make(cat, session, ev, t->history_template);
    if (h == NULL)
        return NULL;
    h->is_history = true;
    table_refusal(cat, h, ev);
    return h;
}

/* The event is refused: its table has no primary key (warned once per table). */
static void reject_no_pk(ces_catalog_table_t *t, const ces_event_t *ev, ces_reject_t *reject) {
    if (!t->warned_no_pk) {
        ces_log_warning("table %s.%s.%s has no primary key: its events go to the dead-letter table",
                        ev->db, ev->schema, ev->table);
        t->warned_no_pk = true;
    }
    *reject = (ces_reject_t){CES_DL_NO_PRIMARY_KEY,
                             "table has no primary key (ces2pg applies changes by primary key)"};
}

/* Whether ev is refused because its table does not exist and cannot be created for it (sets
 * *reject). */
static bool refuse_missing(const ces_catalog_t *cat, ces_catalog_table_t *t, const ces_event_t *ev,
                           ces_reject_t *reject) {
    if (ev->npkkey == 0 && !t->is_history) { /* a history table is keyed on the version */
        reject_no_pk(t, ev, reject);
        return true;
    }
    if (!cat->auto_create) {
        *reject = (ces_reject_t){CES_DL_SCHEMA,
                                 "target table does not exist and schema.auto_create is off"};
        return true;
    }
    return false;
}

/* The DDL of an event's target table failed: unless the failure is transient or about ces2pg
 * itself, it is the event's (ces_pgerr_blame_event), and the event is dead-lettered. Returns -1. */
static int ddl_failed(ces_pgerr_t *e) {
    ces_pgerr_blame_event(e);
    return -1;
}

/* Reads t from pg_catalog the first time it is needed, creating it when it does not exist and
 * adopting it when it lacks the version column. Returns 0, or -1 with e or *reject set. */
static int table_first_load(ces_catalog_t *cat, ces_session_t *session, const char *version_quoted,
                            ces_catalog_table_t *t, const ces_event_t *ev, uint64_t attempt,
                            ces_reject_t *reject, ces_pgerr_t *e) {
    int exists = table_load(cat, session, t, e);
    if (exists < 0)
        return -1;
    if (exists == 0) {
        if (refuse_missing(cat, t, ev, reject)) {
            t->absent_attempt = attempt;
            return -1;
        }
        ces_pgcatalog_names_t names = {cat->preserve_case, cat->version_column,
                                       cat->lsn_guard && !t->is_history ? version_quoted : NULL,
                                       t->is_history, t->deleted_quoted};
        if (ces_pgcatalog_create(session, t->pg_schema, t->desc.qualified, &names, t->source, ev,
                                 e) != 0)
            return ddl_failed(e);
        int created = table_load(cat, session, t, e);
        /* "Already exists" counted as another session's table, yet no table is there: another
         * instance creating it in a transaction not committed yet, or the name is a view's, a
         * sequence's or an index's. Read again after a wait: the first is there then, the second
         * is dead-lettered when it stays so (apply.c's stale). */
        if (created == 0) {
            ces_pgerr_set(e, CES_PGERR_STALE, -1, NULL,
                          "table %s could not be created: another kind of relation has its name",
                          t->desc.qualified);
            e->in_ddl = true;
        }
        if (created <= 0)
            return -1;
    }
    if (table_owner(cat, t, ev, reject, e) != 0)
        return -1;
    if (cat->lsn_guard && !t->is_history && t->desc.version_col < 0) {
        if (ces_pgcatalog_adopt(session, t->desc.qualified, version_quoted, e) != 0)
            return ddl_failed(e);
        if (table_load(cat, session, t, e) < 0)
            return -1;
    }
    if (t->deleted_column != NULL && t->desc.deleted_col < 0) {
        if (ces_pgcatalog_add_deleted_column(session, t->desc.qualified, t->deleted_quoted, e) != 0)
            return ddl_failed(e);
        if (table_load(cat, session, t, e) < 0)
            return -1;
    }
    t->loaded = true;
    return 0;
}

/* Adds the columns this event needs that the table does not have yet (fresh: t was just read).
 * Returns 0, or -1 with e or *reject set. */
static int table_add_missing(const ces_catalog_t *cat, ces_session_t *session,
                             ces_catalog_table_t *t, const ces_event_t *ev, bool fresh,
                             ces_reject_t *reject, ces_pgerr_t *e) {
    const char **missing;
    size_t nmissing;
    if (ces_tableplan_missing_columns(&t->desc, cat->preserve_case, cat->version_column, ev,
                                      &missing, &nmissing) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    if (nmissing > 0 && !cat->auto_evolve) {
        free(missing);
        *reject = (ces_reject_t){CES_DL_SCHEMA, "the event has columns the target table lacks "
                                                "and schema.auto_evolve is off"};
        return -1;
    }
    int rc = nmissing == 0 || fresh ? 0 : table_load(cat, session, t, e); /* someone else may
                                                                           * have added them */
    if (rc >= 0 && nmissing > 0) {
        size_t still = 0;
        for (size_t i = 0; i < nmissing; i++) {
            if (ces_catalog_resolve_column(t, missing[i]) < 0)
                missing[still++] = missing[i];
        }
        nmissing = still;
        ces_pgcatalog_names_t names = {cat->preserve_case, cat->version_column, NULL, false, NULL};
        if (nmissing > 0 && ces_pgcatalog_evolve(session, t->desc.qualified, &names, ev, missing,
                                                 nmissing, e) != 0)
            rc = ddl_failed(e);
        else if (nmissing > 0 && table_load(cat, session, t, e) < 0)
            rc = -1;
    }
    for (size_t i = 0; rc >= 0 && i < nmissing; i++) {
        if (ces_catalog_resolve_column(t, missing[i]) < 0)
            *reject = (ces_reject_t){
                CES_DL_SCHEMA, "a column of the event could not be added to the target table"};
    }
    free(missing);
    return rc < 0 || reject->reason != NULL ? -1 : 0;
}


/* The column of t that ces2pg owns and the PostgreSQL name pg names (a soft-delete column, a
 * history table's own columns), with what it is; NULL when none. */
static const char *owned_column(const ces_catalog_table_t *t, const char *pg, const char **what) {
    static const char *const meta[] = CES_CATALOG_HISTORY_META;
    if (t->deleted_column != NULL && strcmp(pg, t->deleted_column) == 0) {
        *what = "the soft-delete column";
        return t->deleted_column;
    }
    for (size_t i = 0; t->is_history && i < CES_CATALOG_HISTORY_NMETA; i++) {
        if (strcmp(pg, meta[i]) == 0) {
            *what = "a column of the history table's own";
            return meta[i];
        }
    }
    return NULL;
}

/* Whether a source column of ev maps to a column ces2pg owns in t: 1 (with *reject set), 0, or -1
 * when out of memory. */
static int owned_column_collision(const ces_catalog_t *cat, ces_catalog_table_t *t,
                                  const ces_event_t *ev, ces_reject_t *reject) {
    const char **names;
    size_t n;
    if (ces_tableplan_event_columns(ev, &names, &n) != 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *pg = ces_tableplan_column_name(names[i], cat->preserve_case, cat->version_column,
                                             NULL);
        const char *what, *owned = pg != NULL ? owned_column(t, pg, &what) : NULL;
        if (pg == NULL) {
            rc = -1;
        } else if (owned != NULL) {
            snprintf(t->reject_reason, sizeof(t->reject_reason),
                     "name collision: source column '%.100s' maps to %s '%.100s'%s", names[i],
                     what, owned,
                     owned == t->deleted_column
                         ? " (choose another deleted_column in the table's rule)"
                         : "");
            *reject = (ces_reject_t){CES_DL_NAME_COLLISION, t->reject_reason};
            rc = 1;
        }
        free(pg);
    }
    free(names);
    return rc;
}

/* Whether two of ev's source column names map to one target column (sets *reject, or e when out
 * of memory): checked before the table is made or extended, so that neither is merged. */
static bool column_collision(const ces_catalog_t *cat, ces_catalog_table_t *t,
                             const ces_event_t *ev, ces_reject_t *reject, ces_pgerr_t *e) {
    const char *a, *b;
    int rc = ces_tableplan_column_collision(ev, cat->preserve_case, cat->version_column, &a, &b);
    if (rc == 1) {
        snprintf(t->reject_reason, sizeof(t->reject_reason),
                 "name collision: source columns '%.100s' and '%.100s' map to the same "
                 "PostgreSQL column name",
                 a, b);
        *reject = (ces_reject_t){CES_DL_NAME_COLLISION, t->reject_reason};
    }
    if (rc == 0 && (t->deleted_column != NULL || t->is_history))
        rc = owned_column_collision(cat, t, ev, reject);
    if (rc < 0)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return rc != 0;
}

static int table_ready(ces_catalog_t *cat, ces_session_t *session, const char *version_quoted,
                       ces_catalog_table_t *t, const ces_event_t *ev, uint64_t attempt,
                       ces_reject_t *reject, ces_pgerr_t *e);

/* The rule's choice of ev's columns (columns.h). A rule that leaves out or masks a key column refuses the
 * table: every event of it is a dead letter, and the configuration is to blame (logged once). A
 * value that does not convert to the type the rule chose makes its event a type conflict.
 * Returns 0, or -1 with *reject (or e, out of memory) set. */
static int choose_columns(ces_catalog_table_t *t, ces_event_t *ev, ces_arena_t *arena,
                          ces_reject_t *reject, ces_pgerr_t *e) {
    const char *key = NULL;
    int rc = t->refused.reason == NULL
                 ? ces_columns_apply(&t->columns, ev, !t->history_only, arena, &key)
                 : CES_COLUMNS_KEY_LEFT_OUT;
    if (rc == CES_COLUMNS_OK) {
        ev->shaped = true;
        return 0;
    }
    if (rc < 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    if (rc == CES_COLUMNS_NO_CONVERSION) {
        snprintf(t->reject_reason, sizeof(t->reject_reason),
                 "type conflict: a value of column '%.100s' does not convert to the type the rule "
                 "of line %d of schema.tables gives it",
                 key, t->rule_line);
        *reject = (ces_reject_t){CES_DL_TYPE_CONFLICT, t->reject_reason};
        return -1;
    }
    if (t->refused.reason == NULL) {
        snprintf(t->refused_reason, sizeof(t->refused_reason),
                 "the rule of line %d of schema.tables %s the key column '%.100s' "
                 "(changes are applied by key: %s it, or keep a history only)",
                 t->rule_line, rc == CES_COLUMNS_KEY_MASKED ? "masks" : "leaves out", key,
                 rc == CES_COLUMNS_KEY_MASKED ? "do not mask" : "include");
        t->refused = (ces_reject_t){CES_DL_SCHEMA, t->refused_reason};
        ces_log_error("table %s.%s.%s: %s", ev->db, ev->schema, ev->table, t->refused_reason);
    }
    *reject = t->refused;
    return -1;
}

ces_catalog_table_t *ces_catalog_ensure(ces_catalog_t *cat, ces_session_t *session,
                                        const char *version_quoted, ces_event_t *ev,
                                        ces_arena_t *arena,
                                        uint64_t attempt, ces_reject_t *reject, ces_pgerr_t *e) {
    const char *parts[] = {ev->db, ev->schema, ev->table};
    ces_catalog_table_t *t = cat->last;
    if (t == NULL || !ces_map_key_is(cat->last_key, cat->last_klen, '\x1f', parts, 3)) {
        /* Names are bounded by the decoder, so the key is never cut. */
        size_t klen = ces_map_key(cat->last_key, sizeof(cat->last_key), '\x1f', parts, 3);
        cat->last = NULL;
        t = ces_map_get(cat->tables, cat->last_key, klen);
        if (t == NULL) {
            t = table_new(cat, session, ev);
            if (t == NULL || ces_map_put(cat->tables, cat->last_key, klen, t) != 0) {
                table_free(t, NULL);
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return NULL;
            }
        }
        cat->last = t;
        cat->last_klen = klen;
    }
    if (!ev->shaped && ces_columns_any(&t->columns) &&
        choose_columns(t, ev, arena, reject, e) != 0)
        return NULL;
    if (!t->history_only && table_ready(cat, session, version_quoted, t, ev, attempt, reject, e) != 0)
        return NULL;
    if (t->history_template != NULL) {
        if (t->history == NULL && (t->history = history_new(cat, session, t, ev)) == NULL) {
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return NULL;
        }
        if (table_ready(cat, session, version_quoted, t->history, ev, attempt, reject, e) != 0)
            return NULL;
    }
    return t;
}

/* t (a target or a history table) made, extended and checked for ev. Returns 0, or -1 with e or
 * *reject set. */
static int table_ready(ces_catalog_t *cat, ces_session_t *session, const char *version_quoted,
                       ces_catalog_table_t *t, const ces_event_t *ev, uint64_t attempt,
                       ces_reject_t *reject, ces_pgerr_t *e) {
    if (t->refused.reason != NULL) {
        *reject = t->refused;
        return -1;
    }
    if (t->loaded && ces_shapes_known(t->shapes, ev))
        return 0;
    if (column_collision(cat, t, ev, reject, e))
        return -1;
    bool fresh = false;
    if (!t->loaded) {
        /* Found missing earlier in this attempt: asking the server again for each of its events
         * would be a round trip each (a stream of a table left out of a replica is dead-lettered
         * at the rate of those). A table created meanwhile is found by the next attempt. */
        if (t->absent_attempt == attempt && refuse_missing(cat, t, ev, reject))
            return -1;
        if (table_first_load(cat, session, version_quoted, t, ev, attempt, reject, e) != 0)
            return -1;
        fresh = true;
    }
    if (t->desc.npk == 0) {
        reject_no_pk(t, ev, reject);
        return -1;
    }
    /* The common case, cheaply: every column the event names is known (hash lookups only). */
    if (!all_columns_known(t, ev) &&
        table_add_missing(cat, session, t, ev, fresh, reject, e) != 0)
        return -1;
    bool unchecked;
    if (type_conflict(cat, t, ev, reject, &unchecked))
        return -1;
    if (!unchecked)
        ces_shapes_remember(t->shapes, ev);
    return 0;
}
