/*
 * rules: per-table rules, the configuration's schema.tables (rules.h).
 */
#include "conf/rules.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The keys a rule may hold, for the message that refuses another. */
#define RULE_KEYS "match, target, deletes, deleted_column, history, history_table, columns"
#define COLUMNS_KEYS "include, exclude, rename, types, mask"

static void names_free(ces_rule_names_t *names) {
    for (size_t i = 0; i < names->count; i++)
        free(names->items[i]);
    free(names->items);
    names->items = NULL;
    names->count = 0;
}

void ces_rules_free(ces_rules_t *rules) {
    if (rules == NULL)
        return;
    for (size_t i = 0; i < rules->count; i++) {
        names_free(&rules->items[i].include);
        names_free(&rules->items[i].exclude);
        names_free(&rules->items[i].rename_from);
        names_free(&rules->items[i].rename_to);
        names_free(&rules->items[i].type_columns);
        names_free(&rules->items[i].types);
        names_free(&rules->items[i].type_zones);
        names_free(&rules->items[i].mask_columns);
        names_free(&rules->items[i].masks);
        free(rules->items[i].match);
        free(rules->items[i].target);
        free(rules->items[i].deleted_column);
        free(rules->items[i].history_table);
    }
    free(rules->items);
    rules->items = NULL;
    rules->count = 0;
}

const char *ces_rules_target_problem(const char *target, char *why, size_t why_size) {
    const char *dot = strchr(target, '.');
    if (dot == NULL || dot == target || dot[1] == '\0' || strchr(dot + 1, '.') != NULL) {
        snprintf(why, why_size, "must be SCHEMA.TABLE, each part text and {db}, {schema} or "
                                "{table}, like \"{schema}.{table}\" or \"staging.{db}_{table}\"");
        return why;
    }
    for (const char *p = target; (p = strchr(p, '{')) != NULL; p++) {
        if (strncmp(p, "{db}", 4) != 0 && strncmp(p, "{schema}", 8) != 0 &&
            strncmp(p, "{table}", 7) != 0) {
            snprintf(why, why_size,
                     "has an unknown placeholder at '%.20s' (use {db}, {schema}, {table})", p);
            return why;
        }
    }
    return NULL;
}

/* A string member of a rule, copied; *out stays NULL when absent. Returns 0, or -1 with errstr
 * set. */
static int read_string(config_setting_t *s, const char *path, char **out, char *errstr,
                       size_t errstr_size) {
    const char *v = config_setting_get_string(s);
    if (v == NULL) {
        snprintf(errstr, errstr_size, "%s:%d: schema.tables: '%s' must be a string", path,
                 config_setting_source_line(s), config_setting_name(s));
        return -1;
    }
    free(*out);
    if ((*out = strdup(v)) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    return 0;
}

static int refuse(char *errstr, size_t errstr_size, const char *path, int line, const char *what,
                  const char *detail) {
    snprintf(errstr, errstr_size, "%s:%d: schema.tables: %s%s", path, line, what, detail);
    return -1;
}

/* A list of column names (s: an array of strings) into names. Returns 0, or -1 with errstr set. */
static int read_names(ces_rule_names_t *names, config_setting_t *s, const char *path,
                      char *errstr, size_t errstr_size) {
    int line = config_setting_source_line(s);
    if (config_setting_type(s) != CONFIG_TYPE_ARRAY && config_setting_type(s) != CONFIG_TYPE_LIST)
        return refuse(errstr, errstr_size, path, line, "columns: ",
                      "include and exclude are lists of source column names: [ \"A\", \"B\" ]");
    size_t n = (size_t)config_setting_length(s);
    if ((names->items = calloc(n + 1, sizeof(char *))) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *v = config_setting_get_string_elem(s, (unsigned)i);
        if (v == NULL || v[0] == '\0')
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a column name must be a non-empty string");
        if ((names->items[i] = strdup(v)) == NULL) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
        names->count = i + 1;
    }
    return 0;
}

static bool names_have(const ces_rule_names_t *names, const char *name) {
    for (size_t i = 0; i < names->count; i++) {
        if (strcasecmp(names->items[i], name) == 0)
            return true;
    }
    return false;
}

/* A list of pairs (s, as rename and mask hold) about to be read into firsts and seconds, which
 * get room for *n items each. Returns 0, or -1 with errstr set (shape says what s must be). */
static int pairs_new(config_setting_t *s, ces_rule_names_t *firsts, ces_rule_names_t *seconds,
                     size_t *n, const char *path, const char *shape, char *errstr,
                     size_t errstr_size) {
    if (config_setting_type(s) != CONFIG_TYPE_LIST)
        return refuse(errstr, errstr_size, path, config_setting_source_line(s), "columns: ", shape);
    *n = (size_t)config_setting_length(s);
    firsts->items = calloc(*n + 1, sizeof(char *));
    seconds->items = calloc(*n + 1, sizeof(char *));
    if (firsts->items == NULL || seconds->items == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    return 0;
}

/* The two non-empty strings of pair i of s; false when it is not such a pair. */
static bool pair_at(config_setting_t *s, size_t i, const char **first, const char **second) {
    config_setting_t *pair = config_setting_get_elem(s, (unsigned)i);
    *first = config_setting_get_string_elem(pair, 0);
    *second = config_setting_get_string_elem(pair, 1);
    return config_setting_length(pair) == 2 && *first != NULL && *second != NULL &&
           (*first)[0] != '\0' && (*second)[0] != '\0';
}

/* rename = ( ["Source", "target"], ... ) into r. Returns 0, or -1 with errstr set. */
static int read_renames(ces_rule_t *r, config_setting_t *s, const char *path, char *errstr,
                        size_t errstr_size) {
    int line = config_setting_source_line(s);
    const char *shape = "rename is a list of pairs: rename = ( [\"Source\", \"new_name\"] );";
    size_t n;
    if (pairs_new(s, &r->rename_from, &r->rename_to, &n, path, shape, errstr, errstr_size) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const char *from, *to;
        if (!pair_at(s, i, &from, &to))
            return refuse(errstr, errstr_size, path, line, "columns: ", shape);
        if (strlen(to) > 63)
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a new column name must be at most 63 bytes");
        if (names_have(&r->rename_from, from))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a column is renamed twice");
        for (size_t j = 0; j < r->rename_to.count; j++) {
            if (strcasecmp(r->rename_to.items[j], to) == 0)
                return refuse(errstr, errstr_size, path, line, "columns: ",
                              "two columns are renamed to one name");
        }
        r->rename_from.items[i] = strdup(from);
        r->rename_to.items[i] = strdup(to);
        r->rename_from.count = r->rename_to.count = i + 1;
        if (r->rename_from.items[i] == NULL || r->rename_to.items[i] == NULL) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

/* Appends a copy of v to names (whose items hold room for it). Returns 0, or -1. */
static int names_add(ces_rule_names_t *names, const char *v) {
    if ((names->items[names->count] = strdup(v)) == NULL)
        return -1;
    names->count++;
    return 0;
}

static bool zone_name(const char *zone) {
    size_t n = strlen(zone);
    return n > 0 && n <= 64 &&
           strspn(zone, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_/+-:") ==
               n;
}

/* types = ( ["Column", "jsonb"], ["Created", "timestamptz", "Europe/Berlin"] ) into r. Returns 0,
 * or -1 with errstr set. */
static int read_types(ces_rule_t *r, config_setting_t *s, const char *path, char *errstr,
                      size_t errstr_size) {
    int line = config_setting_source_line(s);
    const char *shape = "types is a list: types = ( [\"Payload\", \"jsonb\"], [\"Created\", "
                        "\"timestamptz\", \"Europe/Berlin\"] ); the types are jsonb, json and "
                        "timestamptz (with the zone of the source's local times)";
    if (config_setting_type(s) != CONFIG_TYPE_LIST)
        return refuse(errstr, errstr_size, path, line, "columns: ", shape);
    size_t n = (size_t)config_setting_length(s);
    ces_rule_names_t *lists[] = {&r->type_columns, &r->types, &r->type_zones};
    for (size_t l = 0; l < 3; l++) {
        if ((lists[l]->items = calloc(n + 1, sizeof(char *))) == NULL) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        config_setting_t *item = config_setting_get_elem(s, (unsigned)i);
        int parts = config_setting_length(item);
        const char *column = config_setting_get_string_elem(item, 0);
        const char *type = config_setting_get_string_elem(item, 1);
        const char *zone = parts == 3 ? config_setting_get_string_elem(item, 2) : "";
        bool timestamptz = type != NULL && strcmp(type, "timestamptz") == 0;
        bool json = type != NULL && (strcmp(type, "jsonb") == 0 || strcmp(type, "json") == 0);
        if (column == NULL || column[0] == '\0' || zone == NULL || (!timestamptz && !json) ||
            (timestamptz && parts != 3) || (json && parts != 2))
            return refuse(errstr, errstr_size, path, line, "columns: ", shape);
        if (timestamptz && !zone_name(zone))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a zone is a name like \"Europe/Berlin\" or \"UTC\"");
        if (names_have(&r->type_columns, column))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a column is given two types");
        if (names_add(&r->type_columns, column) != 0 || names_add(&r->types, type) != 0 ||
            names_add(&r->type_zones, zone) != 0) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

/* mask = ( ["Email", "hash"], ["Notes", "null"] ) into r. Returns 0, or -1 with errstr set. */
static int read_masks(ces_rule_t *r, config_setting_t *s, const char *path, char *errstr,
                      size_t errstr_size) {
    int line = config_setting_source_line(s);
    const char *shape = "mask is a list of pairs: mask = ( [\"Email\", \"hash\"], [\"Notes\", "
                        "\"null\"] ); \"hash\" is a keyed hash (schema.mask_key_file), \"null\" "
                        "leaves the column empty";
    size_t n;
    if (pairs_new(s, &r->mask_columns, &r->masks, &n, path, shape, errstr, errstr_size) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const char *column, *how;
        if (!pair_at(s, i, &column, &how) || (strcmp(how, "hash") != 0 && strcmp(how, "null") != 0))
            return refuse(errstr, errstr_size, path, line, "columns: ", shape);
        if (names_have(&r->mask_columns, column))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a column is masked twice");
        if (names_add(&r->mask_columns, column) != 0 || names_add(&r->masks, how) != 0) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            return -1;
        }
    }
    return 0;
}

bool ces_rules_hash_masks(const ces_rules_t *rules) {
    for (size_t i = 0; i < rules->count; i++) {
        for (size_t k = 0; k < rules->items[i].masks.count; k++) {
            if (strcmp(rules->items[i].masks.items[k], "hash") == 0)
                return true;
        }
    }
    return false;
}

/* Whether the column goes under r's include and exclude lists. */
static bool goes(const ces_rule_t *r, const char *column) {
    return (r->include.count == 0 || names_have(&r->include, column)) &&
           !names_have(&r->exclude, column);
}

/* columns = { include = [...]; exclude = [...]; rename = (...); types = (...); mask = (...); } into r. Returns 0, or -1 with
 * errstr set. */
static int read_columns(ces_rule_t *r, config_setting_t *g, const char *path, char *errstr,
                        size_t errstr_size) {
    int line = config_setting_source_line(g);
    if (config_setting_type(g) != CONFIG_TYPE_GROUP)
        return refuse(errstr, errstr_size, path, line, "columns must be a group: ",
                      "columns = { include = [ ... ]; rename = ( [\"A\", \"b\"] ); };");
    for (int k = 0; k < config_setting_length(g); k++) {
        config_setting_t *s = config_setting_get_elem(g, (unsigned)k);
        const char *name = config_setting_name(s);
        int rc;
        if (strcmp(name, "include") == 0)
            rc = read_names(&r->include, s, path, errstr, errstr_size);
        else if (strcmp(name, "exclude") == 0)
            rc = read_names(&r->exclude, s, path, errstr, errstr_size);
        else if (strcmp(name, "rename") == 0)
            rc = read_renames(r, s, path, errstr, errstr_size);
        else if (strcmp(name, "types") == 0)
            rc = read_types(r, s, path, errstr, errstr_size);
        else if (strcmp(name, "mask") == 0)
            rc = read_masks(r, s, path, errstr, errstr_size);
        else {
            snprintf(errstr, errstr_size,
                     "%s:%d: schema.tables: unknown key '%s' in columns (columns hold: " COLUMNS_KEYS
                     ")",
                     path, config_setting_source_line(s), name);
            rc = -1;
        }
        if (rc != 0)
            return -1;
    }
    if (r->include.count > 0 && r->exclude.count > 0)
        return refuse(errstr, errstr_size, path, line, "columns: ",
                      "give include or exclude, not both");
    for (size_t i = 0; i < r->rename_from.count; i++) {
        if (!goes(r, r->rename_from.items[i]))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a renamed column must be one that goes (in include, not in exclude)");
    }
    for (size_t i = 0; i < r->type_columns.count; i++) {
        if (!goes(r, r->type_columns.items[i]))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a column given a type must be one that goes (in include, not in "
                          "exclude)");
    }
    for (size_t i = 0; i < r->mask_columns.count; i++) {
        if (!goes(r, r->mask_columns.items[i]))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a masked column must be one that goes (in include, not in exclude)");
        if (names_have(&r->type_columns, r->mask_columns.items[i]))
            return refuse(errstr, errstr_size, path, line, "columns: ",
                          "a masked column cannot also be given a type (a hash is text)");
    }
    return 0;
}

/* The history keys of r (history: the value of `history`, NULL when absent). Returns 0, or -1 with
 * errstr set. */
static int read_history(ces_rule_t *r, const char *history, const char *path, char *errstr,
                        size_t errstr_size) {
    char why[256];
    if (history == NULL || strcmp(history, "off") == 0)
        r->history = CES_RULE_HISTORY_OFF;
    else if (strcmp(history, "also") == 0)
        r->history = CES_RULE_HISTORY_ALSO;
    else if (strcmp(history, "only") == 0)
        r->history = CES_RULE_HISTORY_ONLY;
    else
        return refuse(errstr, errstr_size, path, r->line,
                      "history must be \"off\", \"also\" (beside the mirror) or \"only\" "
                      "(instead of it)",
                      "");
    if (r->history == CES_RULE_HISTORY_OFF) {
        if (r->history_table != NULL)
            return refuse(errstr, errstr_size, path, r->line,
                          "history_table names the history table: it needs history = \"also\" "
                          "or \"only\"",
                          "");
        return 0;
    }
    if (r->history == CES_RULE_HISTORY_ONLY && (r->target != NULL || r->deleted_column != NULL))
        return refuse(errstr, errstr_size, path, r->line,
                      "with history = \"only\" there is no mirror table: target, deletes and "
                      "deleted_column do not apply",
                      "");
    if (r->history_table == NULL &&
        (r->history_table = strdup(CES_RULES_HISTORY_TABLE_DEFAULT)) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    if (ces_rules_target_problem(r->history_table, why, sizeof(why)) != NULL)
        return refuse(errstr, errstr_size, path, r->line, "history_table ", why);
    if (r->target != NULL && strcmp(r->target, r->history_table) == 0)
        return refuse(errstr, errstr_size, path, r->line,
                      "history_table must differ from target", "");
    return 0;
}

/* One group of the list into r. Returns 0, or -1 with errstr set. */
static int read_rule(ces_rule_t *r, config_setting_t *g, const char *path, char *errstr,
                     size_t errstr_size) {
    char why[256];
    r->line = config_setting_source_line(g);
    if (config_setting_type(g) != CONFIG_TYPE_GROUP)
        return refuse(errstr, errstr_size, path, r->line,
                      "each rule must be a group: tables = ( { match = \"dbo.Orders\"; ... } );",
                      "");
    char *deletes = NULL, *history = NULL;
    int rc = -1;
    for (int k = 0; k < config_setting_length(g); k++) {
        config_setting_t *s = config_setting_get_elem(g, (unsigned)k);
        const char *name = config_setting_name(s);
        if (strcmp(name, "columns") == 0) {
            if (read_columns(r, s, path, errstr, errstr_size) != 0)
                goto done;
            continue;
        }
        char **field = strcmp(name, "match") == 0            ? &r->match
                       : strcmp(name, "target") == 0         ? &r->target
                       : strcmp(name, "deletes") == 0        ? &deletes
                       : strcmp(name, "deleted_column") == 0 ? &r->deleted_column
                       : strcmp(name, "history") == 0        ? &history
                       : strcmp(name, "history_table") == 0  ? &r->history_table
                                                             : NULL;
        if (field == NULL) {
            snprintf(errstr, errstr_size,
                     "%s:%d: schema.tables: unknown key '%s' in a rule (a rule holds: " RULE_KEYS
                     ")",
                     path, config_setting_source_line(s), name);
            goto done;
        }
        if (read_string(s, path, field, errstr, errstr_size) != 0)
            goto done;
    }
    if (r->match == NULL || r->match[0] == '\0') {
        refuse(errstr, errstr_size, path, r->line,
               "a rule needs match = \"SCHEMA.TABLE\" (the source table, or a pattern like "
               "\"sales.*\")",
               "");
        goto done;
    }
    r->pattern = strpbrk(r->match, "*?[") != NULL;
    if (r->target != NULL && ces_rules_target_problem(r->target, why, sizeof(why)) != NULL) {
        refuse(errstr, errstr_size, path, r->line, "target ", why);
        goto done;
    }
    if (deletes == NULL || strcmp(deletes, "hard") == 0) {
        r->deletes = CES_RULE_DELETES_HARD;
    } else if (strcmp(deletes, "soft") == 0) {
        r->deletes = CES_RULE_DELETES_SOFT;
    } else {
        refuse(errstr, errstr_size, path, r->line, "deletes must be \"hard\" or \"soft\"", "");
        goto done;
    }
    if (r->deleted_column != NULL && r->deletes != CES_RULE_DELETES_SOFT) {
        refuse(errstr, errstr_size, path, r->line,
               "deleted_column is the column a soft delete sets: it needs deletes = \"soft\"", "");
        goto done;
    }
    if (r->deletes == CES_RULE_DELETES_SOFT && r->deleted_column == NULL &&
        (r->deleted_column = strdup(CES_RULES_DELETED_COLUMN_DEFAULT)) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        goto done;
    }
    if (r->deleted_column != NULL &&
        (r->deleted_column[0] == '\0' || strlen(r->deleted_column) > 63)) {
        refuse(errstr, errstr_size, path, r->line, "deleted_column must be 1 to 63 bytes", "");
        goto done;
    }
    if (read_history(r, history, path, errstr, errstr_size) != 0)
        goto done;
    rc = 0;
done:
    free(deletes);
    free(history);
    return rc;
}

/* Whether every table r matches is matched by e already. Exact for a table; for a pattern, when
 * it is e's own, or e is "PREFIX*" (no other glob character) and r starts with PREFIX: the cases
 * a configuration meets, not every pattern's inclusion. */
static bool covers(const ces_rule_t *e, const ces_rule_t *r) {
    if (!r->pattern)
        return fnmatch(e->match, r->match, FNM_CASEFOLD) == 0;
    if (strcasecmp(e->match, r->match) == 0 || strcmp(e->match, "*.*") == 0)
        return true;
    size_t prefix = strlen(e->match) - 1;
    return e->match[prefix] == '*' && strcspn(e->match, "*?[") == prefix &&
           strncasecmp(e->match, r->match, prefix) == 0;
}

int ces_rules_read(ces_rules_t *rules, config_setting_t *list, const char *path, char *errstr,
                   size_t errstr_size) {
    int line = config_setting_source_line(list);
    if (config_setting_type(list) != CONFIG_TYPE_LIST)
        return refuse(errstr, errstr_size, path, line,
                      "must be a list of rules: tables = ( { match = \"dbo.Orders\"; ... }, ... );",
                      "");
    size_t n = (size_t)config_setting_length(list);
    if (n == 0)
        return 0;
    if ((rules->items = calloc(n, sizeof(*rules->items))) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        ces_rule_t *r = &rules->items[i];
        rules->count = i + 1;
        if (read_rule(r, config_setting_get_elem(list, (unsigned)i), path, errstr, errstr_size) !=
            0)
            return -1;
        /* The first match wins: a rule an earlier one matches in full never applies. */
        for (size_t j = 0; j < i; j++) {
            const ces_rule_t *e = &rules->items[j];
            if (covers(e, r)) {
                snprintf(errstr, errstr_size,
                         "%s:%d: schema.tables: the rule for '%s' never applies: the rule of line "
                         "%d matches its tables first (the first match wins: put the narrower "
                         "rule first)",
                         path, r->line, r->match, e->line);
                return -1;
            }
        }
    }
    return 0;
}

int ces_rules_check(const ces_rules_t *rules, const char *version_column, const char *path,
                    char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < rules->count; i++) {
        const ces_rule_t *r = &rules->items[i];
        if (r->deleted_column != NULL && version_column != NULL &&
            strcmp(r->deleted_column, version_column) == 0)
            return refuse(errstr, errstr_size, path, r->line,
                          "deleted_column may not be the version column (apply.version_column)",
                          "");
    }
    return 0;
}

const ces_rule_t *ces_rules_match(const ces_rules_t *rules, const char *schema,
                                  const char *table) {
    if (rules == NULL || rules->count == 0)
        return NULL;
    size_t n = strlen(schema) + strlen(table) + 2;
    char stack[512], *name = n <= sizeof(stack) ? stack : malloc(n);
    if (name == NULL)
        return NULL;
    snprintf(name, n, "%s.%s", schema, table);
    const ces_rule_t *found = NULL;
    for (size_t i = 0; i < rules->count && found == NULL; i++) {
        const ces_rule_t *r = &rules->items[i];
        if (r->pattern ? fnmatch(r->match, name, FNM_CASEFOLD) == 0
                       : strcasecmp(r->match, name) == 0)
            found = r;
    }
    if (name != stack)
        free(name);
    return found;
}

static void describe_deletes(FILE *out, ces_rule_deletes_t deletes, const char *column) {
    if (deletes == CES_RULE_DELETES_SOFT)
        fprintf(out, "deletes soft (a delete keeps the row and sets %s to the commit time)",
                column);
    else
        fputs("deletes hard", out);
}

static void describe_names(FILE *out, const char *what, const ces_rule_names_t *names) {
    if (names->count == 0)
        return;
    fprintf(out, ", %s ", what);
    for (size_t i = 0; i < names->count; i++)
        fprintf(out, "%s%s", i ? ", " : "", names->items[i]);
}

static void describe_columns(FILE *out, const ces_rule_t *r) {
    describe_names(out, "only the columns", &r->include);
    describe_names(out, "all columns but", &r->exclude);
    for (size_t i = 0; i < r->rename_from.count; i++)
        fprintf(out, "%s%s as %s", i ? ", " : ", renaming ", r->rename_from.items[i],
                r->rename_to.items[i]);
    for (size_t i = 0; i < r->type_columns.count; i++)
        fprintf(out, "%s%s as %s%s%s", i ? ", " : ", typing ", r->type_columns.items[i],
                r->types.items[i], r->type_zones.items[i][0] ? " at " : "",
                r->type_zones.items[i]);
    for (size_t i = 0; i < r->mask_columns.count; i++)
        fprintf(out, "%s%s %s", i ? ", " : ", masking ", r->mask_columns.items[i],
                strcmp(r->masks.items[i], "hash") == 0 ? "by keyed hash" : "as NULL");
}

void ces_rules_describe(FILE *out, const ces_rules_t *rules, const char *default_target) {
    for (size_t i = 0; i < rules->count; i++) {
        const ces_rule_t *r = &rules->items[i];
        fprintf(out, "tables: %s %s (line %d): ", r->pattern ? "pattern" : "table", r->match,
                r->line);
        if (r->history == CES_RULE_HISTORY_ONLY) {
            fprintf(out, "history only, in %s (append only, no mirror)", r->history_table);
        } else {
            fprintf(out, "target %s, ", r->target ? r->target : default_target);
            describe_deletes(out, r->deletes, r->deleted_column);
            if (r->history == CES_RULE_HISTORY_ALSO)
                fprintf(out, ", every change also in %s", r->history_table);
        }
        describe_columns(out, r);
        fputc('\n', out);
    }
    fprintf(out, "tables: %s: target %s, ",
            rules->count ? "any other table" : "every table (no rule in schema.tables)",
            default_target);
    describe_deletes(out, CES_RULE_DELETES_HARD, NULL);
    fputc('\n', out);
}
