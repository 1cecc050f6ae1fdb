#include "conf/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conf/secret.h"
#include "util/array.h"
#include "util/clock.h"
#include "util/log.h"

#include "conf/keys.h"

static const ces_config_key_t *find_key(const char *name) {
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        if (strcmp(ces_config_keys[i].name, name) == 0)
            return &ces_config_keys[i];
    }
    return NULL;
}

static bool group_known(const char *group) {
    size_t len = strlen(group);
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        if (strncmp(ces_config_keys[i].name, group, len) == 0 && ces_config_keys[i].name[len] == '.')
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
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        void *field = (char *)config + ces_config_keys[i].offset;
        if (ces_config_keys[i].type == KEY_STRING)
            free(*(char **)field);
        else if (ces_config_keys[i].type == KEY_STRING_LIST)
            strlist_free(field);
    }
    char *const secrets[] = {config->pg_password, config->identity_client_secret,
                             config->schema_mask_key};
    for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
        if (secrets[i] != NULL)
            explicit_bzero(secrets[i], strlen(secrets[i]));
        free(secrets[i]);
    }
    ces_rules_free(&config->schema_tables);
    free(config->path);
    free(config);
}

/* Expands ${NAME} references to environment variables in a string value. Returns a new string, or
 * NULL with errstr naming the file, line, key and variable. A '$' not followed by '{' is kept. */
static char *expand_env(const char *in, const char *file, int line, const char *key, char *errstr,
                        size_t errstr_size) {
    if (strstr(in, "${") == NULL)
        return strdup(in);
    size_t cap = strlen(in) + 1, len = 0;
    char *out = malloc(cap);
    for (const char *p = in; out != NULL && *p != '\0';) {
        const char *add = p;
        size_t n = 1;
        if (p[0] == '$' && p[1] == '{') {
            const char *close = strchr(p + 2, '}');
            size_t name_len = close ? (size_t)(close - (p + 2)) : 0;
            if (close == NULL || name_len == 0 || name_len > 255) {
                snprintf(errstr, errstr_size,
                         "%s:%d: %s: '${' must be followed by a variable name and '}'", file, line,
                         key);
                free(out);
                return NULL;
            }
            char name[256];
            memcpy(name, p + 2, name_len);
            name[name_len] = '\0';
            add = getenv(name);
            if (add == NULL) {
                snprintf(errstr, errstr_size, "%s:%d: %s: environment variable %s is not set", file,
                         line, key, name);
                free(out);
                return NULL;
            }
            n = strlen(add);
            p = close + 1;
        } else {
            p++;
        }
        char *bigger = CES_ARRAY_RESERVE(out, cap, len + n + 1, 1);
        if (bigger == NULL) {
            free(out);
            out = NULL;
            break;
        }
        out = bigger;
        memcpy(out + len, add, n);
        len += n;
    }
    if (out == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", file);
        return NULL;
    }
    out[len] = '\0';
    return out;
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
static int set_from_text(ces_config_t *config, const ces_config_key_t *key, const char *text) {
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

static int set_from_setting(ces_config_t *config, const ces_config_key_t *key, config_setting_t *s,
                            const char *file, char *errstr, size_t errstr_size) {
    void *field = (char *)config + key->offset;
    int line = config_setting_source_line(s);
    int type = config_setting_type(s);
    switch (key->type) {
    case KEY_STRING:
        if (type != CONFIG_TYPE_STRING)
            goto wrong_type;
        free(*(char **)field);
        *(char **)field =
            expand_env(config_setting_get_string(s), file, line, key->name, errstr, errstr_size);
        if (*(char **)field == NULL)
            return -1;
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
            int item_line = (int)config_setting_source_line(e);
            list->lines[i] = item_line > 0 ? item_line : line;
            list->items[i] = expand_env(config_setting_get_string(e), file, list->lines[i],
                                        key->name, errstr, errstr_size);
            if (list->items[i] == NULL)
                return -1;
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

/* Line of a key in the file, or of its group, or 1: for error messages. */
static int line_of(config_t *cfg, const char *name) {
    config_setting_t *s = config_lookup(cfg, name);
    if (s == NULL) {
        char group[64];
        snprintf(group, sizeof(group), "%.*s", (int)strcspn(name, "."), name);
        s = config_lookup(cfg, group);
    }
    return s ? config_setting_source_line(s) : 1;
}

/* Puts "FILE:LINE: " and the message in errstr, LINE being key's (line_of). Returns -1. */
static int __attribute__((format(printf, 6, 7)))
refuse(config_t *cfg, const char *file, const char *key, char *errstr, size_t errstr_size,
       const char *fmt, ...) {
    int n = snprintf(errstr, errstr_size, "%s:%d: ", file, line_of(cfg, key));
    if (n >= 0 && (size_t)n < errstr_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr + n, errstr_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static bool one_of(const char *value, const char *a, const char *b) {
    return strcmp(value, a) == 0 || strcmp(value, b) == 0;
}

static int validate_kafka(const ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                          size_t errstr_size) {
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
    if (!one_of(c->kafka_format, "auto", "json") && strcmp(c->kafka_format, "avro") != 0)
        return refuse(cfg, file, "kafka.format", errstr, errstr_size,
                      "kafka.format must be \"auto\", \"json\" or \"avro\"");
    if (!one_of(c->kafka_on_source_gap, "stop", "continue"))
        return refuse(cfg, file, "kafka.on_source_gap", errstr, errstr_size,
                      "kafka.on_source_gap must be \"stop\" or \"continue\"");
    return 0;
}

static int validate_apply(ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                          size_t errstr_size) {
    if (!one_of(c->apply_ordering, "transaction", "partition"))
        return refuse(cfg, file, "apply.ordering", errstr, errstr_size,
                      "apply.ordering must be \"transaction\" or \"partition\"");
    /* A window that starts above the default maximum may grow from there unless told otherwise. */
    bool max_given = config_lookup(cfg, "apply.reorder_window_max_ms") != NULL;
    if (!max_given && c->apply_reorder_window_max_ms < c->apply_reorder_window_ms)
        c->apply_reorder_window_max_ms = c->apply_reorder_window_ms;
    if (c->apply_reorder_window_max_ms < c->apply_reorder_window_ms)
        return refuse(cfg, file, "apply.reorder_window_max_ms", errstr, errstr_size,
                      "apply.reorder_window_max_ms (%lld) is below apply.reorder_window_ms "
                      "(%lld): the window starts at the one and grows up to the other",
                      (long long)c->apply_reorder_window_max_ms,
                      (long long)c->apply_reorder_window_ms);
    if (ces_clock_parse_duration(c->apply_tombstone_retention, &c->apply_tombstone_retention_s) != 0)
        return refuse(cfg, file, "apply.tombstone_retention", errstr, errstr_size,
                      "apply.tombstone_retention must be a number and a unit, like \"8 days\" "
                      "(seconds, minutes, hours, days)");
    if (c->apply_version_column[0] == '\0' || strlen(c->apply_version_column) > 63)
        return refuse(cfg, file, "apply.version_column", errstr, errstr_size,
                      "apply.version_column must be 1 to 63 bytes");
    return 0;
}

static int validate_schema(const ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                           size_t errstr_size) {
    char why[256];
    if (ces_rules_target_problem(c->schema_target, why, sizeof(why)) != NULL)
        return refuse(cfg, file, "schema.target", errstr, errstr_size, "schema.target %s", why);
    if (ces_rules_check(&c->schema_tables, c->apply_lsn_guard ? c->apply_version_column : NULL,
                        file, errstr, errstr_size) != 0)
        return -1;
    if (!one_of(c->schema_identifier_case, "lower", "preserve"))
        return refuse(cfg, file, "schema.identifier_case", errstr, errstr_size,
                      "schema.identifier_case must be \"lower\" or \"preserve\"");
    return 0;
}

static int validate_http_listen(const ces_config_t *c, config_t *cfg, const char *file,
                                char *errstr, size_t errstr_size) {
    if (c->http_listen[0] == '\0')
        return 0;
    const char *colon = strrchr(c->http_listen, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon == c->http_listen || end == colon + 1 || *end != '\0' || port < 1 ||
        port > 65535)
        return refuse(cfg, file, "http.listen", errstr, errstr_size,
                      "http.listen must be \"HOST:PORT\" (like \"127.0.0.1:9187\" or "
                      "\"[::1]:9187\"), or \"\" for no HTTP server");
    return 0;
}

/* Semantic checks that go beyond one key's type, in the order of the keys' groups (the first
 * failure is reported). */
static int validate(ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                    size_t errstr_size) {
    ces_log_level_t level;
    if (ces_log_level_parse(c->log_level, &level) != 0)
        return refuse(cfg, file, "log.level", errstr, errstr_size,
                      "log.level must be one of error, warning, info, debug");
    if (validate_kafka(c, cfg, file, errstr, errstr_size) != 0 ||
        validate_apply(c, cfg, file, errstr, errstr_size) != 0 ||
        validate_schema(c, cfg, file, errstr, errstr_size) != 0)
        return -1;
    if (!one_of(c->log_format, "text", "json"))
        return refuse(cfg, file, "log.format", errstr, errstr_size,
                      "log.format must be \"text\" or \"json\"");
    if (validate_http_listen(c, cfg, file, errstr, errstr_size) != 0)
        return -1;
    if (c->schema_metadata[0] == '\0') {
        snprintf(errstr, errstr_size, "%s: schema.metadata_schema must not be empty", file);
        return -1;
    }
    return 0;
}

/* postgres.password_file: the password, one line without control characters. */
static int settle_postgres_password(ces_config_t *c, config_t *cfg, const char *file,
                                    char *errstr, size_t errstr_size) {
    if (c->pg_password_file == NULL)
        return 0;
    int line = line_of(cfg, "postgres.password_file");
    c->pg_password = ces_secret_read_file(file, line, "postgres.password_file", c->pg_password_file,
                                      errstr, errstr_size);
    if (c->pg_password == NULL)
        return -1;
    if (!ces_secret_one_line(c->pg_password)) {
        snprintf(errstr, errstr_size,
                 "%s:%d: postgres.password_file: the password must be one line without control "
                 "characters (the value is not shown)",
                 file, line);
        return -1;
    }
    return 0;
}

/* The shortest key schema.mask_key_file may hold: 128 bits as hexadecimal digits would be 32
 * characters, but a passphrase of 16 is still far beyond guessing and RFC 2104 asks no more. */
#define MASK_KEY_MIN 16

/* schema.mask_key_file: the key of the rules' hash masks, which a rule that masks by hash needs. */
static int settle_mask_key(ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                           size_t errstr_size) {
    if (c->schema_mask_key_file == NULL) {
        if (!ces_rules_hash_masks(&c->schema_tables))
            return 0;
        snprintf(errstr, errstr_size,
                 "%s:%d: schema.tables: a rule masks a column by \"hash\", which needs "
                 "schema.mask_key_file: a file of at least %d characters only ces2pg may read "
                 "(openssl rand -hex 32 > mask.key; chmod 600 mask.key)",
                 file, line_of(cfg, "schema.tables"), MASK_KEY_MIN);
        return -1;
    }
    int line = line_of(cfg, "schema.mask_key_file");
    c->schema_mask_key = ces_secret_read_file(file, line, "schema.mask_key_file",
                                              c->schema_mask_key_file, errstr, errstr_size);
    if (c->schema_mask_key == NULL)
        return -1;
    if (strlen(c->schema_mask_key) < MASK_KEY_MIN || !ces_secret_one_line(c->schema_mask_key)) {
        snprintf(errstr, errstr_size,
                 "%s:%d: schema.mask_key_file: the key must be one line of at least %d characters "
                 "(the value is not shown; openssl rand -hex 32 makes one)",
                 file, line, MASK_KEY_MIN);
        return -1;
    }
    return 0;
}

/* The identity's names as identity/identity.h parses them (conf only checks the word, for the
 * file and line in the message). */
static bool identity_source_known(const char *name) {
    static const char *const names[] = {"auto",          "managed_identity", "app_service",
                                        "workload_identity", "client_secret", "command"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i]) == 0)
            return true;
    }
    return false;
}

/* https://<the first broker's host>/.default: the Event Hubs namespace's scope. */
static char *scope_of_brokers(const char *brokers) {
    size_t host = strcspn(brokers, ",:");
    size_t n = sizeof("https:///.default") + host;
    char *scope = malloc(n);
    if (scope != NULL)
        snprintf(scope, n, "https://%.*s/.default", (int)host, brokers);
    return scope;
}

/* Microsoft Entra ID: kafka.auth and postgres.auth with what they need, the Kafka scope derived
 * from the brokers, the identity's client secret read from its file. Fetches nothing. */
static int settle_entra(ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                        size_t errstr_size) {
    const char *conn = c->kafka_eventhubs_connection_string;
    if (c->kafka_auth == NULL &&
        (c->kafka_auth = strdup(conn != NULL ? "connection_string" : "properties")) == NULL)
        goto nomem;
    bool kafka_entra = strcmp(c->kafka_auth, "entra") == 0;
    if (!kafka_entra && !one_of(c->kafka_auth, "connection_string", "properties"))
        return refuse(cfg, file, "kafka.auth", errstr, errstr_size,
                      "kafka.auth must be \"entra\", \"connection_string\" or \"properties\"");
    if ((kafka_entra && conn != NULL) ||
        (strcmp(c->kafka_auth, "connection_string") == 0 && conn == NULL))
        return refuse(cfg, file, "kafka.auth", errstr, errstr_size,
                      "kafka.auth = \"%s\" %s an Event Hubs connection string", c->kafka_auth,
                      kafka_entra ? "takes no" : "needs");
    if (kafka_entra && c->kafka_entra_scope == NULL && c->kafka_brokers != NULL &&
        (c->kafka_entra_scope = scope_of_brokers(c->kafka_brokers)) == NULL)
        goto nomem;
    bool pg_entra = strcmp(c->pg_auth, "entra") == 0;
    if (!pg_entra && strcmp(c->pg_auth, "password") != 0)
        return refuse(cfg, file, "postgres.auth", errstr, errstr_size,
                      "postgres.auth must be \"password\" or \"entra\"");
    if (pg_entra && c->pg_password_file != NULL)
        return refuse(cfg, file, "postgres.password_file", errstr, errstr_size,
                      "postgres.auth = \"entra\" takes no password_file: the token is the password");
    if (!identity_source_known(c->identity_source))
        return refuse(cfg, file, "identity.source", errstr, errstr_size,
                      "identity.source must be one of auto, managed_identity, app_service, "
                      "workload_identity, client_secret, command");
    bool secret = strcmp(c->identity_source, "client_secret") == 0;
    if (secret != (c->identity_client_secret_file != NULL))
        return refuse(cfg, file, secret ? "identity.source" : "identity.client_secret_file", errstr,
                      errstr_size, "identity.client_secret_file goes with identity.source = "
                      "\"client_secret\", and only with it (the secret is never inline)");
    if (strcmp(c->identity_source, "command") == 0 && c->identity_command == NULL)
        return refuse(cfg, file, "identity.source", errstr, errstr_size,
                      "identity.source = \"command\" needs identity.command");
    if (c->identity_client_secret_file != NULL) {
        int line = line_of(cfg, "identity.client_secret_file");
        c->identity_client_secret =
            ces_secret_read_file(file, line, "identity.client_secret_file",
                                 c->identity_client_secret_file, errstr, errstr_size);
        if (c->identity_client_secret == NULL)
            return -1;
        if (!ces_secret_one_line(c->identity_client_secret))
            return refuse(cfg, file, "identity.client_secret_file", errstr, errstr_size,
                          "identity.client_secret_file: the secret must be one line without "
                          "control characters (the value is not shown)");
    }
    return 0;
nomem:
    snprintf(errstr, errstr_size, "%s: out of memory", file);
    return -1;
}

/* Static group membership: the key, else $CES2PG_GROUP_INSTANCE_ID (which the systemd unit and the
 * compose file set per instance); "" in either turns it off. */
static int settle_group_instance_id(ces_config_t *c, const char *file, char *errstr,
                                    size_t errstr_size) {
    const char *env = getenv(CES_CONFIG_GROUP_INSTANCE_ENV);
    if (c->kafka_group_instance_id == NULL && env != NULL &&
        (c->kafka_group_instance_id = strdup(env)) == NULL) {
        snprintf(errstr, errstr_size, "%s: out of memory", file);
        return -1;
    }
    if (c->kafka_group_instance_id != NULL && c->kafka_group_instance_id[0] == '\0') {
        free(c->kafka_group_instance_id);
        c->kafka_group_instance_id = NULL;
    }
    /* What Kafka accepts as a static member's name (brokers refuse the join otherwise). */
    const char *id = c->kafka_group_instance_id;
    size_t len = id ? strlen(id) : 0;
    bool valid = len <= 249;
    for (size_t i = 0; i < len && valid; i++)
        valid = isalnum((unsigned char)id[i]) || id[i] == '.' || id[i] == '_' || id[i] == '-';
    if (!valid) {
        snprintf(errstr, errstr_size,
                 "%s: kafka.group_instance_id (or $%s) must be 1 to 249 letters, digits, '.', '_' "
                 "or '-', not '%.60s'",
                 file, CES_CONFIG_GROUP_INSTANCE_ENV, id);
        return -1;
    }
    return 0;
}

/* Event Hubs mode and TLS files: one source of the connection string, the bootstrap servers
 * derived from it when kafka.brokers is not set, files readable. Never quotes the secret. */
static int settle_kafka_security(ces_config_t *c, config_t *cfg, const char *file, char *errstr,
                                 size_t errstr_size) {
    if (c->kafka_eventhubs_connection_string_file != NULL) {
        int line = line_of(cfg, "kafka.eventhubs_connection_string_file");
        if (c->kafka_eventhubs_connection_string != NULL) {
            snprintf(errstr, errstr_size,
                     "%s:%d: set either kafka.eventhubs_connection_string or "
                     "kafka.eventhubs_connection_string_file, not both",
                     file, line);
            return -1;
        }
        c->kafka_eventhubs_connection_string =
            ces_secret_read_file(file, line, "kafka.eventhubs_connection_string_file",
                             c->kafka_eventhubs_connection_string_file, errstr, errstr_size);
        if (c->kafka_eventhubs_connection_string == NULL)
            return -1;
    }
    const char *conn = c->kafka_eventhubs_connection_string;
    if (conn != NULL) {
        const char *key = c->kafka_eventhubs_connection_string_file
                              ? "kafka.eventhubs_connection_string_file"
                              : "kafka.eventhubs_connection_string";
        int line = line_of(cfg, key);
        char host[256];
        if (ces_secret_eventhubs_host(conn, host, sizeof(host)) != 0) {
            snprintf(errstr, errstr_size,
                     "%s:%d: %s: not an Event Hubs connection string: no "
                     "Endpoint=sb://NAMESPACE.servicebus.windows.net/ part (the value is not shown)",
                     file, line, key);
            return -1;
        }
        if (!ces_secret_one_line(conn)) {
            snprintf(errstr, errstr_size,
                     "%s:%d: %s: the connection string must be one line without control "
                     "characters (the value is not shown)",
                     file, line, key);
            return -1;
        }
        if (c->kafka_brokers == NULL) {
            size_t n = strlen(host) + sizeof(":9093");
            c->kafka_brokers = malloc(n);
            if (c->kafka_brokers == NULL) {
                snprintf(errstr, errstr_size, "%s: out of memory", file);
                return -1;
            }
            /* Event Hubs' Kafka endpoint listens on 9093. */
            snprintf(c->kafka_brokers, n, "%s%s", host, strchr(host, ':') ? "" : ":9093");
        }
    }
    if (c->kafka_ssl_ca_file != NULL) {
        FILE *f = fopen(c->kafka_ssl_ca_file, "r");
        if (f == NULL) {
            snprintf(errstr, errstr_size, "%s:%d: kafka.ssl_ca_file: cannot read '%s': %s", file,
                     line_of(cfg, "kafka.ssl_ca_file"), c->kafka_ssl_ca_file, strerror(errno));
            return -1;
        }
        fclose(f);
    }
    return 0;
}

/* Walks what the file has, so that every unknown key is caught, and fills c from it. Returns 0,
 * or -1 with errstr set. */
static int read_settings(ces_config_t *c, config_t *cfg, const char *path, char *errstr,
                         size_t errstr_size) {
    config_setting_t *root = config_root_setting(cfg);
    for (int g = 0; g < config_setting_length(root); g++) {
        config_setting_t *group = config_setting_get_elem(root, (unsigned)g);
        const char *gname = config_setting_name(group);
        int gline = config_setting_source_line(group);
        if (!group_known(gname)) {
            snprintf(errstr, errstr_size, "%s:%d: unknown key '%s'", path, gline, gname);
            return -1;
        }
        if (config_setting_type(group) != CONFIG_TYPE_GROUP) {
            snprintf(errstr, errstr_size, "%s:%d: '%s' must be a group: %s = { ... };", path, gline,
                     gname, gname);
            return -1;
        }
        for (int k = 0; k < config_setting_length(group); k++) {
            config_setting_t *s = config_setting_get_elem(group, (unsigned)k);
            char full[256];
            snprintf(full, sizeof(full), "%s.%s", gname, config_setting_name(s));
            if (strcmp(full, "schema.tables") == 0) { /* a list of groups: conf/rules.h */
                if (ces_rules_read(&c->schema_tables, s, path, errstr, errstr_size) != 0)
                    return -1;
                continue;
            }
            const ces_config_key_t *key = find_key(full);
            if (key == NULL) {
                snprintf(errstr, errstr_size, "%s:%d: unknown key '%s'", path,
                         config_setting_source_line(s), full);
                return -1;
            }
            if (set_from_setting(c, key, s, path, errstr, errstr_size) != 0)
                return -1;
        }
    }
    return 0;
}

/* Every key mode requires is in the file. Returns 0, or -1 with errstr set. */
static int check_required(config_t *cfg, ces_config_mode_t mode, const char *path, char *errstr,
                          size_t errstr_size) {
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        bool required = mode == CES_CONFIG_DAEMON ? ces_config_keys[i].required_for_daemon
                                                  : ces_config_keys[i].required_for_replay;
        /* Event Hubs mode derives kafka.brokers from the connection string. */
        bool brokers = strcmp(ces_config_keys[i].name, "kafka.brokers") == 0;
        if (brokers && (config_lookup(cfg, "kafka.eventhubs_connection_string") != NULL ||
                        config_lookup(cfg, "kafka.eventhubs_connection_string_file") != NULL))
            required = false;
        if (required && config_lookup(cfg, ces_config_keys[i].name) == NULL) {
            /* Point at the group that lacks the key, or at the top of the file. */
            snprintf(errstr, errstr_size, "%s:%d: missing required key '%s'%s", path,
                     line_of(cfg, ces_config_keys[i].name), ces_config_keys[i].name,
                     brokers ? " (or kafka.eventhubs_connection_string, from which it is derived)"
                             : "");
            return -1;
        }
    }
    return 0;
}

/* A file that holds a secret in its own text (not a ${NAME} reference, not a *_file key) must be
 * as private as a secret file. */
static int refuse_loose_file(config_t *cfg, const char *path, char *errstr, size_t errstr_size) {
    const char *key = NULL, *v;
    if (config_lookup_string(cfg, "kafka.eventhubs_connection_string", &v) &&
        ces_secret_connection_string_literal(v))
        key = "kafka.eventhubs_connection_string";
    else if (config_lookup_string(cfg, "postgres.conninfo", &v) && ces_secret_conninfo_literal(v))
        key = "postgres.conninfo";
    config_setting_t *props = config_lookup(cfg, "kafka.properties");
    for (int i = 0; key == NULL && props != NULL && i < config_setting_length(props); i++) {
        const char *item = config_setting_get_string_elem(props, (unsigned)i);
        if (item != NULL && ces_secret_property_literal(item))
            key = "kafka.properties";
    }
    struct stat st;
    if (key == NULL || stat(path, &st) != 0 || ces_secret_private(&st))
        return 0;
    char what[512];
    snprintf(what, sizeof(what), "%s:%d: %s", path, line_of(cfg, key), key);
    ces_secret_explain_loose(what, path, &st, errstr, errstr_size);
    return -1;
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
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        if (ces_config_keys[i].default_value != NULL && set_from_text(c, &ces_config_keys[i], ces_config_keys[i].default_value) != 0) {
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

    if (read_settings(c, &cfg, path, errstr, errstr_size) != 0 ||
        refuse_loose_file(&cfg, path, errstr, errstr_size) != 0 ||
        check_required(&cfg, mode, path, errstr, errstr_size) != 0)
        goto done;
    if (settle_kafka_security(c, &cfg, path, errstr, errstr_size) != 0 ||
        settle_group_instance_id(c, path, errstr, errstr_size) != 0 ||
        settle_postgres_password(c, &cfg, path, errstr, errstr_size) != 0 ||
        settle_mask_key(c, &cfg, path, errstr, errstr_size) != 0 ||
        settle_entra(c, &cfg, path, errstr, errstr_size) != 0)
        goto done;
    if (mode == CES_CONFIG_DAEMON && c->kafka_topics.count == 0) {
        snprintf(errstr, errstr_size, "%s:%d: kafka.topics must name at least one topic", path,
                 line_of(&cfg, "kafka.topics"));
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
