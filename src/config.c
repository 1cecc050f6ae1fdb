
#include "config.h"

#include <inttypes.h>
#include <libconfig.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef enum { KEY_STRING, KEY_INT, KEY_BOOL, KEY_STRING_LIST } key_type_t;

typedef struct {
    const char *name; /* "group.key" */
    key_type_t type;
    size_t offset; /* of the field in ces_config_t */
    const char *default_value; /* NULL: no default (required, or empty list) */
    bool required_for_daemon;
    bool required_for_replay;
    int64_t min, max; /* KEY_INT bounds */
} key_t_;

#define F(field) offsetof(ces_config_t, field)

/* The single table of configuration keys (documented one by one in conf/ces2pg.conf). */
static const key_t_ keys[] = {
    {"kafka.brokers", KEY_STRING, F(kafka_brokers), NULL, true, false, 0, 0},
    {"kafka.topics", KEY_STRING_LIST, F(kafka_topics), NULL, true, false, 0, 0},
    {"kafka.group_id", KEY_STRING, F(kafka_group_id), "ces2pg", false, false, 0, 0},
    {"kafka.properties", KEY_STRING_LIST, F(kafka_properties), NULL, false, false, 0, 0},
    {"kafka.poll_ms", KEY_INT, F(kafka_poll_ms), "100", false, false, 1, 10000},
    {"postgres.conninfo", KEY_STRING, F(pg_conninfo), NULL, true, true, 0, 0},
    {"postgres.retry_max_ms", KEY_INT, F(pg_retry_max_ms), "30000", false, false, 100, 3600000},
    {"apply.batch_max_events", KEY_INT, F(apply_batch_max_events), "5000", false, false, 1,
     1000000},
    {"apply.batch_max_ms", KEY_INT, F(apply_batch_max_ms), "100", false, false, 0, 600000},
    {"schema.metadata_schema", KEY_STRING, F(schema_metadata), "ces2pg", false, false, 0, 0},
    {"schema.auto_create", KEY_BOOL, F(schema_auto_create), "true", false, false, 0, 0},
    {"schema.auto_evolve", KEY_BOOL, F(schema_auto_evolve), "true", false, false, 0, 0},
    {"decode.max_record_bytes", KEY_INT, F(decode_max_record_bytes), "2097152", false, false, 1024,
     INT64_C(1) << 30},
    {"decode.max_event_bytes", KEY_INT, F(decode_max_event_bytes), "67108864", false, false, 1024,
     INT64_C(1) << 32},
    {"decode.max_depth", KEY_INT, F(decode_max_depth), "16", false, false, 4, 1000},
    {"decode.max_columns", KEY_INT, F(decode_max_columns), "4096", false, false, 1, 100000},
    {"decode.max_value_bytes", KEY_INT, F(decode_max_value_bytes), "2097152", false, false, 1,
     INT64_C(1) << 30},
    {"reassembly.max_bytes", KEY_INT, F(reassembly_max_bytes), "67108864", false, false, 1024,
     INT64_C(1) << 34},
    {"reassembly.max_segments", KEY_INT, F(reassembly_max_segments), "4096", false, false, 2,
     1000000},
    {"reassembly.timeout_ms", KEY_INT, F(reassembly_timeout_ms), "300000", false, false, 10,
     INT64_C(86400000)},
    {"log.level", KEY_STRING, F(log_level), "info", false, false, 0, 0},
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static const key_t_ *find_key(const char *name) {
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    }
    return NULL;
}

static bool group_known(const char *group) {
    size_t len = strlen(group);
    for (size_t i = 0; i < NKEYS; i++) {
        if (strncmp(keys[i].name, group, len) == 0 && keys[i].name[len] == '.')
            return true;
    }
    return false;
}

static void strlist_free(ces_strlist_t *list) {
    for (size_t i = 0; i < list->count; i++)
        free(list->items[i]);
    free(list->items);
    free(list->lines);
    memset(list, 0, sizeof(*list));
}

void ces_config_destroy(ces_config_t *config) {
    if (config == NULL)
        return;
    for (size_t i = 0; i < NKEYS; i++) {
        void *field = (char *)config + keys[i].offset;
        if (keys[i].type == KEY_STRING)
            free(*(char **)field);
        else if (keys[i].type == KEY_STRING_LIST)
            strlist_free(field);
    }
    free(config->path);
    free(config);
}

static const char *type_name(key_type_t type) {
    switch (type) {
    case KEY_STRING: return "a string";
    case KEY_INT: return "an integer";
    case KEY_BOOL: return "a boolean (true or false)";
    case KEY_STRING_LIST: return "a list of strings, like [ \"a\", \"b\" ]";
    }
    return "?";
}

/* Stores a value given as text (the table's defaults). */
static int set_from_text(ces_config_t *config, const key_t_ *key, const char *text) {
    void *field = (char *)config + key->offset;
    switch (key->type) {
    case KEY_STRING:
        free(*(char **)field);
        *(char **)field = strdup(text);
        return *(char **)field ? 0 : -1;
    case KEY_INT:
        *(int64_t *)field = strtoll(text, NULL, 10);
        return 0;
    case KEY_BOOL:
        *(bool *)field = strcmp(text, "true") == 0;
        return 0;
    case KEY_STRING_LIST:
        return 0;
    }
    return -1;
}

static int set_from_setting(ces_config_t *config, const key_t_ *key, config_setting_t *s,
                            const char *file, char *errstr, size_t errstr_size) {
    void *field = (char *)config + key->offset;
    int line = config_setting_source_line(s);
    int type = config_setting_type(s);
    switch (key->type) {
    case KEY_STRING:
        if (type != CONFIG_TYPE_STRING)
            goto wrong_type;
        free(*(char **)field);
        *(char **)field = strdup(config_setting_get_string(s));
        break;
    case KEY_INT: {
        if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
            goto wrong_type;
        long long v = config_setting_get_int64(s);
        if (v < key->min || v > key->max) {
            snprintf(errstr, errstr_size, "%s:%d: %s = %lld is out of range (%" PRId64 "..%" PRId64 ")",
                     file, line, key->name, v, key->min, key->max);
            return -1;
        }
        *(int64_t *)field = v;
        break;
    }
    case KEY_BOOL:
        if (type != CONFIG_TYPE_BOOL)
            goto wrong_type;
        *(bool *)field = config_setting_get_bool(s) != 0;
        break;
    case KEY_STRING_LIST: {
        if (type != CONFIG_TYPE_ARRAY && type != CONFIG_TYPE_LIST)
            goto wrong_type;
        ces_strlist_t *list = field;
        strlist_free(list);
        int n = config_setting_length(s);
        list->items = calloc((size_t)n + 1, sizeof(char *));
        list->lines = calloc((size_t)n + 1, sizeof(int));
        if (list->items == NULL || list->lines == NULL)
            goto nomem;
        for (int i = 0; i < n; i++) {
            config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
            if (config_setting_type(e) != CONFIG_TYPE_STRING)
                goto wrong_type;
            list->items[i] = strdup(config_setting_get_string(e));
            if (list->items[i] == NULL)
                goto nomem;
            int item_line = (int)config_setting_source_line(e);
            list->lines[i] = item_line > 0 ? item_line : line;
            list->count++;
        }
        break;
    }
    }
    return 0;
wrong_type:
    snprintf(errstr, errstr_size, "%s:%d: %s must be %s", file, line, key->name,
             type_name(key->type));
    return -1;
nomem:
    snprintf(errstr, errstr_size, "%s: out of memory", file);
    return -1;
}

/* Semantic checks that go beyond one key's type. */
static int validate(const ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                    size_t errstr_size) {
    ces_log_level_t level;
    if (ces_log_level_parse(c->log_level, &level) != 0) {
        config_setting_t *s = config_lookup(cfg, "log.level");
        snprintf(errstr, errstr_size, "%s:%d: log.level must be one of error, warning, info, debug",
                 file, s ? config_setting_source_line(s) : 0);
        return -1;
    }
    for (size_t i = 0; i < c->kafka_properties.count; i++) {
        const char *p = c->kafka_properties.items[i];
        const char *eq = strchr(p, '=');
        if (eq == NULL || eq == p) {
            snprintf(errstr, errstr_size,
                     "%s:%d: kafka.properties: '%s' is not of the form name=value", file,
                     c->kafka_properties.lines[i], p);
            return -1;
        }
    }
    for (size_t i = 0; i < c->kafka_topics.count; i++) {
        if (c->kafka_topics.items[i][0] == '\0') {
            snprintf(errstr, errstr_size, "%s:%d: kafka.topics: empty topic name", file,
                     c->kafka_topics.lines[i]);
            return -1;
        }
    }
    if (c->schema_metadata[0] == '\0') {
        snprintf(errstr, errstr_size, "%s: schema.metadata_schema must not be empty", file);
        return -1;
    }
    return 0;
}

ces_config_status_t ces_config_load(const char *path, ces_config_mode_t mode, ces_config_t **out,
                                    char *errstr, size_t errstr_size) {
    ces_config_status_t status = CES_CONFIG_ERROR;
    config_t cfg;
    config_init(&cfg);
    ces_config_t *c = calloc(1, sizeof(*c));
    *out = NULL;
    if (c == NULL || (c->path = strdup(path)) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < NKEYS; i++) {
        if (keys[i].default_value != NULL && set_from_text(c, &keys[i], keys[i].default_value) != 0) {
            snprintf(errstr, errstr_size, "%s: out of memory", path);
            goto done;
        }
    }

    if (config_read_file(&cfg, path) != CONFIG_TRUE) {
        if (config_error_type(&cfg) == CONFIG_ERR_FILE_IO)
            snprintf(errstr, errstr_size, "%s: cannot read the configuration file", path);
        else
            snprintf(errstr, errstr_size, "%s:%d: %s", config_error_file(&cfg) ? config_error_file(&cfg) : path,
                     config_error_line(&cfg), config_error_text(&cfg));
        goto done;
    }

    /* Walk what the file has, so that every unknown key is caught, then fill the table. */
    config_setting_t *root = config_root_setting(&cfg);
    for (int g = 0; g < config_setting_length(root); g++) {
        config_setting_t *group = config_setting_get_elem(root, (unsigned)g);
        const char *gname = config_setting_name(group);
        int gline = config_setting_source_line(group);
        if (!group_known(gname)) {
            snprintf(errstr, errstr_size, "%s:%d: unknown key '%s'", path, gline, gname);
            goto done;
        }
        if (config_setting_type(group) != CONFIG_TYPE_GROUP) {
            snprintf(errstr, errstr_size, "%s:%d: '%s' must be a group: %s = { ... };", path, gline,
                     gname, gname);
            goto done;
        }
        for (int k = 0; k < config_setting_length(group); k++) {
            config_setting_t *s = config_setting_get_elem(group, (unsigned)k);
            char full[256];
            snprintf(full, sizeof(full), "%s.%s", gname, config_setting_name(s));
            const key_t_ *key = find_key(full);
            if (key == NULL) {
                snprintf(errstr, errstr_size, "%s:%d: unknown key '%s'", path,
                         config_setting_source_line(s), full);
                goto done;
            }
            if (set_from_setting(c, key, s, path, errstr, errstr_size) != 0)
                goto done;
        }
    }
    for (size_t i = 0; i < NKEYS; i++) {
        bool required = mode == CES_CONFIG_DAEMON ? keys[i].required_for_daemon
                                                  : keys[i].required_for_replay;
        if (required && config_lookup(&cfg, keys[i].name) == NULL) {
            /* Point at the group that lacks the key, or at the top of the file. */
            char group[64];
            snprintf(group, sizeof(group), "%.*s", (int)strcspn(keys[i].name, "."), keys[i].name);
            config_setting_t *g = config_lookup(&cfg, group);
            snprintf(errstr, errstr_size, "%s:%d: missing required key '%s'", path,
                     g ? config_setting_source_line(g) : 1, keys[i].name);
            goto done;
        }
    }
    if (mode == CES_CONFIG_DAEMON && c->kafka_topics.count == 0) {
        config_setting_t *s = config_lookup(&cfg, "kafka.topics");
        snprintf(errstr, errstr_size, "%s:%d: kafka.topics must name at least one topic", path,
                 s ? config_setting_source_line(s) : 1);
        goto done;
    }
    if (validate(c, &cfg, path, errstr, errstr_size) != 0)
        goto done;

    *out = c;
    c = NULL;
    status = CES_CONFIG_OK;
done:
    ces_config_destroy(c);
    config_destroy(&cfg);
    return status;
}

bool ces_config_is_secret_property(const char *name, size_t len) {
    static const char *const words[] = {"password", "secret", "key", "token", "jaas"};
    char lower[128];
    if (len >= sizeof(lower))
        len = sizeof(lower) - 1;
    for (size_t i = 0; i < len; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
    lower[len] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (strstr(lower, words[i]) != NULL)
            return true;
    }
    return false;
}

void ces_config_print(const ces_config_t *c, FILE *out) {
    for (size_t i = 0; i < NKEYS; i++) {
        const void *field = (const char *)c + keys[i].offset;
        fprintf(out, "%s = ", keys[i].name);
        switch (keys[i].type) {
        case KEY_STRING: {
            const char *v = *(char *const *)field;
            /* The connection string may carry a password: print its keys, never its values. */
            if (v != NULL && strcmp(keys[i].name, "postgres.conninfo") == 0)
                fprintf(out, "(set, %zu characters)\n", strlen(v));
            else
                fprintf(out, "\"%s\"\n", v ? v : "");
            break;
        }
        case KEY_INT: fprintf(out, "%" PRId64 "\n", *(const int64_t *)field); break;
        case KEY_BOOL: fprintf(out, "%s\n", *(const bool *)field ? "true" : "false"); break;
        case KEY_STRING_LIST: {
            const ces_strlist_t *l = field;
            bool props = strcmp(keys[i].name, "kafka.properties") == 0;
            fprintf(out, "[");
            for (size_t j = 0; j < l->count; j++) {
                const char *item = l->items[j];
                size_t name_len = strcspn(item, "=");
                /* librdkafka properties may carry credentials: show only their names. */
                if (props && ces_config_is_secret_property(item, name_len))
                    fprintf(out, "%s\"%.*s=(secret)\"", j ? ", " : " ", (int)name_len, item);
                else
                    fprintf(out, "%s\"%s\"", j ? ", " : " ", item);
            }
            fprintf(out, " ]\n");
            break;
        }
        }
    }
}
