#include "conf/keys.h"

#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "conf/config.h"
#include "conf/secret.h"

#define RELOAD true
#define RESTART false

#define F(field) offsetof(ces_config_t, field)

/* The single table of configuration keys (documented one by one in conf/ces2pg.conf). */
const ces_config_key_t ces_config_keys[] = {
    /* Required for the daemon unless an Event Hubs connection string is given (see load). */
    {"kafka.brokers", KEY_STRING, F(kafka_brokers), NULL, true, false, 0, 0, RESTART},
    {"kafka.topics", KEY_STRING_LIST, F(kafka_topics), NULL, true, false, 0, 0, RESTART},
    {"kafka.group_id", KEY_STRING, F(kafka_group_id), "ces2pg", false, false, 0, 0, RESTART},
    {"kafka.properties", KEY_STRING_LIST, F(kafka_properties), NULL, false, false, 0, 0, RESTART},
    {"kafka.poll_ms", KEY_INT, F(kafka_poll_ms), "100", false, false, 1, 10000, RESTART},
    {"kafka.format", KEY_STRING, F(kafka_format), "auto", false, false, 0, 0, RESTART},
    {"kafka.eventhubs_connection_string", KEY_STRING, F(kafka_eventhubs_connection_string), NULL,
     false, false, 0, 0, RESTART},
    {"kafka.eventhubs_connection_string_file", KEY_STRING,
     F(kafka_eventhubs_connection_string_file), NULL, false, false, 0, 0, RESTART},
    {"kafka.ssl_ca_file", KEY_STRING, F(kafka_ssl_ca_file), NULL, false, false, 0, 0, RESTART},
    {"kafka.on_source_gap", KEY_STRING, F(kafka_on_source_gap), "stop", false, false, 0, 0,
     RESTART},
    {"kafka.group_instance_id", KEY_STRING, F(kafka_group_instance_id), NULL, false, false, 0, 0,
     RESTART},
    {"kafka.auth", KEY_STRING, F(kafka_auth), NULL, false, false, 0, 0, RESTART},
    {"kafka.entra_scope", KEY_STRING, F(kafka_entra_scope), NULL, false, false, 0, 0, RESTART},
    {"postgres.conninfo", KEY_STRING, F(pg_conninfo), NULL, true, true, 0, 0, RESTART},
    {"postgres.password_file", KEY_STRING, F(pg_password_file), NULL, false, false, 0, 0, RESTART},
    {"postgres.retry_max_ms", KEY_INT, F(pg_retry_max_ms), "30000", false, false, 100, 3600000, RESTART},
    {"postgres.auth", KEY_STRING, F(pg_auth), "password", false, false, 0, 0, RESTART},
    {"postgres.entra_scope", KEY_STRING, F(pg_entra_scope),
     "https://ossrdbms-aad.database.windows.net/.default", false, false, 0, 0, RESTART},
    {"apply.batch_max_events", KEY_INT, F(apply_batch_max_events), "5000", false, false, 1,
     1000000, RESTART},
    {"apply.batch_max_bytes", KEY_INT, F(apply_batch_max_bytes), "4194304", false, false, 65536,
     INT64_C(1) << 34, RESTART},
    {"apply.batch_max_ms", KEY_INT, F(apply_batch_max_ms), "100", false, false, 0, 600000, RESTART},
    {"apply.ordering", KEY_STRING, F(apply_ordering), "transaction", false, false, 0, 0, RESTART},
    {"apply.reorder_window_ms", KEY_INT, F(apply_reorder_window_ms), "200", false, false, 0,
     600000, RESTART},
    {"apply.reorder_window_max_ms", KEY_INT, F(apply_reorder_window_max_ms), "5000", false, false,
     0, 600000, RESTART},
    {"apply.reorder_window_adaptive", KEY_BOOL, F(apply_reorder_window_adaptive), "true", false,
     false, 0, 0, RESTART},
    {"apply.max_pending_events", KEY_INT, F(apply_max_pending_events), "10000", false, false, 100,
     100000000, RESTART},
    {"apply.max_pending_bytes", KEY_INT, F(apply_max_pending_bytes), "16777216", false, false,
     65536, INT64_C(1) << 40, RESTART},
    {"apply.dedup_window", KEY_INT, F(apply_dedup_window), "100000", false, false, 0, 100000000, RESTART},
    {"apply.lsn_guard", KEY_BOOL, F(apply_lsn_guard), "true", false, false, 0, 0, RESTART},
    {"apply.version_column", KEY_STRING, F(apply_version_column), "_ces_lsn", false, false, 0, 0, RESTART},
    {"apply.tombstone_retention", KEY_STRING, F(apply_tombstone_retention), "8 days", false, false,
     0, 0, RESTART},
    {"schema.metadata_schema", KEY_STRING, F(schema_metadata), "ces2pg", false, false, 0, 0, RESTART},
    {"schema.target", KEY_STRING, F(schema_target), "{schema}.{table}", false, false, 0, 0, RESTART},
    {"schema.identifier_case", KEY_STRING, F(schema_identifier_case), "lower", false, false, 0, 0, RESTART},
    {"schema.mask_key_file", KEY_STRING, F(schema_mask_key_file), NULL, false, false, 0, 0, RESTART},
    {"schema.include", KEY_STRING_LIST, F(schema_include), NULL, false, false, 0, 0, RESTART},
    {"schema.exclude", KEY_STRING_LIST, F(schema_exclude), NULL, false, false, 0, 0, RESTART},
    {"schema.auto_create", KEY_BOOL, F(schema_auto_create), "true", false, false, 0, 0, RESTART},
    {"schema.auto_evolve", KEY_BOOL, F(schema_auto_evolve), "true", false, false, 0, 0, RESTART},
    {"decode.max_record_bytes", KEY_INT, F(decode_max_record_bytes), "2097152", false, false, 1024,
     INT64_C(1) << 30, RESTART},
    {"decode.max_event_bytes", KEY_INT, F(decode_max_event_bytes), "67108864", false, false, 1024,
     INT64_C(1) << 32, RESTART},
    {"decode.max_depth", KEY_INT, F(decode_max_depth), "16", false, false, 4, 1000, RESTART},
    {"decode.max_columns", KEY_INT, F(decode_max_columns), "4096", false, false, 1, 100000, RESTART},
    {"decode.max_value_bytes", KEY_INT, F(decode_max_value_bytes), "2097152", false, false, 1,
     INT64_C(1) << 30, RESTART},
    {"decode.threads", KEY_INT, F(decode_threads), "0", false, false, 0, 64, RESTART},
    {"reassembly.max_bytes", KEY_INT, F(reassembly_max_bytes), "67108864", false, false, 1024,
     INT64_C(1) << 34, RESTART},
    {"reassembly.max_segments", KEY_INT, F(reassembly_max_segments), "4096", false, false, 2,
     1000000, RESTART},
    {"reassembly.max_groups", KEY_INT, F(reassembly_max_groups), "65536", false, false, 16,
     10000000, RESTART},
    {"reassembly.max_logicalid_bytes", KEY_INT, F(reassembly_max_logicalid_bytes), "512", false,
     false, 64, 65536, RESTART},
    {"reassembly.timeout_ms", KEY_INT, F(reassembly_timeout_ms), "300000", false, false, 10,
     INT64_C(86400000), RESTART},
    {"identity.source", KEY_STRING, F(identity_source), "auto", false, false, 0, 0, RESTART},
    {"identity.client_id", KEY_STRING, F(identity_client_id), NULL, false, false, 0, 0, RESTART},
    {"identity.tenant_id", KEY_STRING, F(identity_tenant_id), NULL, false, false, 0, 0, RESTART},
    {"identity.authority_host", KEY_STRING, F(identity_authority_host), NULL, false, false, 0, 0,
     RESTART},
    {"identity.federated_token_file", KEY_STRING, F(identity_federated_token_file), NULL, false,
     false, 0, 0, RESTART},
    {"identity.client_secret_file", KEY_STRING, F(identity_client_secret_file), NULL, false, false,
     0, 0, RESTART},
    {"identity.imds_endpoint", KEY_STRING, F(identity_imds_endpoint), NULL, false, false, 0, 0,
     RESTART},
    {"identity.identity_endpoint", KEY_STRING, F(identity_endpoint), NULL, false, false, 0, 0,
     RESTART},
    {"identity.command", KEY_STRING, F(identity_command), NULL, false, false, 0, 0, RESTART},
    {"identity.timeout_ms", KEY_INT, F(identity_timeout_ms), "10000", false, false, 100, 600000,
     RESTART},
    {"log.level", KEY_STRING, F(log_level), "info", false, false, 0, 0, RELOAD},
    {"log.format", KEY_STRING, F(log_format), "text", false, false, 0, 0, RELOAD},
    {"log.progress_interval", KEY_INT, F(log_progress_interval), "10", false, false, 0, 86400,
     RELOAD},
    {"ha.lease_ms", KEY_INT, F(ha_lease_ms), "10000", false, false, 1000, 600000, RESTART},
    {"http.listen", KEY_STRING, F(http_listen), "127.0.0.1:9187", false, false, 0, 0, RELOAD},
};

const size_t ces_config_nkeys = sizeof(ces_config_keys) / sizeof(ces_config_keys[0]);

void ces_config_print(const ces_config_t *c, FILE *out) {
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        const void *field = (const char *)c + ces_config_keys[i].offset;
        fprintf(out, "%s = ", ces_config_keys[i].name);
        switch (ces_config_keys[i].type) {
        case KEY_STRING: {
            const char *v = *(char *const *)field;
            /* The connection string may carry a password: print its keys, never its values. */
            if (v != NULL && strcmp(ces_config_keys[i].name, "postgres.conninfo") == 0)
                fprintf(out, "(set, %zu characters)\n", strlen(v));
            else if (strcmp(ces_config_keys[i].name, "kafka.eventhubs_connection_string") == 0)
                /* A secret: not even its length. */
                fprintf(out, "%s\n", v != NULL ? "(set)" : "\"\"");
            else
                fprintf(out, "\"%s\"\n", v ? v : "");
            break;
        }
        case KEY_INT: fprintf(out, "%" PRId64 "\n", *(const int64_t *)field); break;
        case KEY_BOOL: fprintf(out, "%s\n", *(const bool *)field ? "true" : "false"); break;
        case KEY_STRING_LIST: {
            const ces_strlist_t *l = field;
            bool props = strcmp(ces_config_keys[i].name, "kafka.properties") == 0;
            fprintf(out, "[");
            for (size_t j = 0; j < l->count; j++) {
                const char *item = l->items[j];
                size_t name_len = strcspn(item, "=");
                /* librdkafka properties may carry credentials: show only their names. */
                if (props && ces_secret_property_name(item, name_len))
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

void ces_config_diff(const ces_config_t *a, const ces_config_t *b,
                     void (*fn)(const char *key, bool reloadable, void *arg), void *arg) {
    for (size_t i = 0; i < ces_config_nkeys; i++) {
        const void *fa = (const char *)a + ces_config_keys[i].offset, *fb = (const char *)b + ces_config_keys[i].offset;
        bool same = true;
        switch (ces_config_keys[i].type) {
        case KEY_STRING: {
            const char *x = *(char *const *)fa, *y = *(char *const *)fb;
            same = (x == NULL && y == NULL) || (x != NULL && y != NULL && strcmp(x, y) == 0);
            break;
        }
        case KEY_INT: same = *(const int64_t *)fa == *(const int64_t *)fb; break;
        case KEY_BOOL: same = *(const bool *)fa == *(const bool *)fb; break;
        case KEY_STRING_LIST: {
            const ces_strlist_t *x = fa, *y = fb;
            same = x->count == y->count;
            for (size_t j = 0; same && j < x->count; j++)
                same = strcmp(x->items[j], y->items[j]) == 0;
            break;
        }
        }
        if (!same)
            fn(ces_config_keys[i].name, ces_config_keys[i].reloadable, arg);
    }
}

size_t ces_config_key_count(void) {
    return ces_config_nkeys;
}

bool ces_config_key_info(size_t index, ces_config_key_info_t *info) {
    if (index >= ces_config_nkeys)
        return false;
    const ces_config_key_t *k = &ces_config_keys[index];
    static const char *const type_names[] = {
        [KEY_STRING] = "string",
        [KEY_INT] = "integer",
        [KEY_BOOL] = "boolean",
        [KEY_STRING_LIST] = "list of strings",
    };
    *info = (ces_config_key_info_t){
        .name = k->name,
        .type = type_names[k->type],
        .default_value = k->default_value,
        .required_for_daemon = k->required_for_daemon,
        .required_for_replay = k->required_for_replay,
        .has_range = k->type == KEY_INT,
        .min = k->min,
        .max = k->max,
        .reloadable = k->reloadable,
    };
    return true;
}
