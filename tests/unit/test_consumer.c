/*
 * The translation of the configuration into librdkafka properties (consumer.c): ces2pg's defaults,
 * Event Hubs mode and Microsoft's recommended settings, kafka.properties overriding defaults, the
 * properties ces2pg reserves or forces, and errors that name file and line without quoting
 * secrets. librdkafka itself reports each value (nothing connects).
 */
#include "test_util.h"

#include <unistd.h>

#include "conf/config.h"
#include "input/consumer.h"

static char path[64];

/* A configuration with kafka_group as its kafka section and more (other sections) after it. */
static ces_config_t *load_with(const char *kafka_group, const char *more) {
    char text[2048];
    snprintf(text, sizeof(text),
             "kafka = {\n%s\n};\npostgres = { conninfo = \"host=localhost dbname=x\"; };\n%s\n",
             kafka_group, more);
    strcpy(path, "/tmp/ces2pg-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ces_config_t *c = NULL;
    char err[512];
    ces_config_status_t st = ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err));
    unlink(path);
    if (st != CES_CONFIG_OK)
        fail_msg("%s", err);
    return c;
}

static ces_config_t *load(const char *kafka_group) { return load_with(kafka_group, ""); }

#define PARTITION_ORDER "apply = { ordering = \"partition\"; };"

/* Asserts the value librdkafka would be given for name. */
static void assert_property(const ces_config_t *c, const char *name, const char *expected) {
    char value[512], err[512];
    ces_consumer_status_t st = ces_consumer_property(c, name, value, sizeof(value), err,
                                                     sizeof(err));
    if (st != CES_CONSUMER_OK)
        fail_msg("%s: %s", name, err);
    if (strcmp(value, expected) != 0)
        fail_msg("%s is '%s', expected '%s'", name, value, expected);
}

/* Asserts that nobody gives librdkafka's property name a value. */
static void assert_unset(const ces_config_t *c, const char *name) {
    char value[512], err[512];
    assert_int_equal(ces_consumer_property(c, name, value, sizeof(value), err, sizeof(err)),
                     CES_CONSUMER_CONFIG);
    assert_non_null(strstr(err, "no value"));
}

/* Asserts that config is refused with a message holding want (and not secret, when given). */
static void assert_refused(const ces_config_t *c, const char *want, const char *secret) {
    char value[64], err[512];
    ces_consumer_status_t st = ces_consumer_property(c, "group.id", value, sizeof(value), err,
                                                     sizeof(err));
    assert_int_equal(st, CES_CONSUMER_CONFIG);
    if (strstr(err, want) == NULL)
        fail_msg("'%s' does not say '%s'", err, want);
    if (secret != NULL && strstr(err, secret) != NULL)
        fail_msg("'%s' shows the secret", err);
    char err2[512];
    assert_int_equal(ces_consumer_check_config(c, err2, sizeof(err2)), CES_CONSUMER_CONFIG);
}

static void plain_broker_gets_ces2pg_defaults(void **state) {
    (void)state;
    ces_config_t *c = load("brokers = \"127.0.0.1:9092\"; topics = [\"ces\"]; group_id = \"g\";");
    assert_property(c, "bootstrap.servers", "127.0.0.1:9092");
    assert_property(c, "group.id", "g");
    /* Positions live in PostgreSQL: Kafka's are stored by ces2pg after each commit. */
    assert_property(c, "enable.auto.offset.store", "false");
    assert_property(c, "enable.auto.commit", "true");
    assert_property(c, "auto.offset.reset", "smallest"); /* librdkafka's name for earliest */
    assert_property(c, "max.partition.fetch.bytes", "262144");
    assert_property(c, "queued.min.messages", "2000");
    assert_property(c, "queued.max.messages.kbytes", "8192");
    assert_property(c, "enable.partition.eof", "true");
    assert_property(c, "security.protocol", "plaintext"); /* librdkafka's own default */
    /* Rebalances move only what changes owner; a vanished member is noticed within 10 s. */
    assert_property(c, "partition.assignment.strategy", "cooperative-sticky");
    assert_property(c, "session.timeout.ms", "10000");
    assert_property(c, "heartbeat.interval.ms", "3000");
    /* Transaction order: only the group's writer joins, always under one name (writer.h). */
    assert_property(c, "group.instance.id", "ces2pg-writer-g-d5af7d17");
    ces_config_destroy(c);
    c = load_with("brokers = \"127.0.0.1:9092\"; topics = [\"ces\"]; group_id = \"g/x y\";",
                  "");
    assert_property(c, "group.instance.id", "ces2pg-writer-g_x_y-d5af7d17");
    ces_config_destroy(c);
    c = load_with("brokers = \"127.0.0.1:9092\"; topics = [\"ces\"]; group_id = \"g\";",
                  PARTITION_ORDER);
    assert_unset(c, "group.instance.id"); /* partition order: dynamic membership unless asked */
    ces_config_destroy(c);
}

/* In partition order, kafka.group_instance_id, else $CES2PG_GROUP_INSTANCE_ID, is the static group
 * membership id; "" turns it off; setting it through kafka.properties is refused. */
static void static_membership_from_key_or_environment(void **state) {
    (void)state;
    unsetenv(CES_CONFIG_GROUP_INSTANCE_ENV);
    ces_config_t *c = load_with("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
                                "group_instance_id = \"host-a\";",
                                PARTITION_ORDER);
    assert_property(c, "group.instance.id", "host-a");
    ces_config_destroy(c);
    setenv(CES_CONFIG_GROUP_INSTANCE_ENV, "host-b.ces2pg", 1);
    c = load_with("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";", PARTITION_ORDER);
    assert_property(c, "group.instance.id", "host-b.ces2pg");
    ces_config_destroy(c);
    c = load_with("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
                  "group_instance_id = \"\";",
                  PARTITION_ORDER);
    assert_unset(c, "group.instance.id");
    ces_config_destroy(c);
    unsetenv(CES_CONFIG_GROUP_INSTANCE_ENV);
    c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
             "properties = [ \"group.instance.id=x\" ];");
    assert_refused(c, ":3: kafka.properties: 'group.instance.id' is set by ces2pg itself", NULL);
    ces_config_destroy(c);
}

static void properties_override_defaults_but_not_what_ces2pg_forces(void **state) {
    (void)state;
    ces_config_t *c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
                           "properties = [ \"auto.offset.reset=latest\", "
                           "\"max.partition.fetch.bytes=1048576\", \"fetch.wait.max.ms=50\", "
                           "\"enable.partition.eof=false\" ];");
    assert_property(c, "auto.offset.reset", "largest");
    assert_property(c, "max.partition.fetch.bytes", "1048576");
    assert_property(c, "fetch.wait.max.ms", "50");
    /* The orderer needs to know when a partition is caught up. */
    assert_property(c, "enable.partition.eof", "true");
    ces_config_destroy(c);
}

static void eventhubs_mode_sets_sasl_and_microsofts_settings(void **state) {
    (void)state;
    ces_config_t *c = load(
        "eventhubs_connection_string = \"Endpoint=sb://ns1.servicebus.windows.net/;"
        "SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0LWtleS12YWx1ZQ==\";\n"
        "topics = [\"hub\"]; group_id = \"g\";\n"
        "properties = [ \"session.timeout.ms=45000\" ];");
    assert_property(c, "bootstrap.servers", "ns1.servicebus.windows.net:9093");
    assert_property(c, "security.protocol", "sasl_ssl");
    assert_property(c, "sasl.mechanisms", "PLAIN");
    assert_property(c, "sasl.username", "$ConnectionString");
    assert_property(c, "socket.keepalive.enable", "true");
    assert_property(c, "metadata.max.age.ms", "180000");
    assert_property(c, "connections.max.idle.ms", "180000");
    assert_property(c, "heartbeat.interval.ms", "3000");
    assert_property(c, "max.poll.interval.ms", "300000");
    assert_property(c, "session.timeout.ms", "45000"); /* overridden in kafka.properties */
    ces_config_destroy(c);
    c = load("eventhubs_connection_string = \"Endpoint=sb://ns1.servicebus.windows.net/;"
             "SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0LWtleS12YWx1ZQ==\";\n"
             "topics = [\"hub\"]; group_id = \"g\";");
    assert_property(c, "session.timeout.ms", "30000"); /* Microsoft's, over ces2pg's default */
    ces_config_destroy(c);
}

static void reserved_properties_are_refused_with_file_and_line(void **state) {
    (void)state;
    ces_config_t *c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
                           "properties = [ \"group.id=other\" ];");
    assert_refused(c, ":3: kafka.properties: 'group.id' is set by ces2pg itself", NULL);
    ces_config_destroy(c);

    c = load("eventhubs_connection_string = \"Endpoint=sb://ns1.servicebus.windows.net/;"
             "SharedAccessKeyName=l;SharedAccessKey=c2VjcmV0LWtleS12YWx1ZQ==\";\n"
             "topics = [\"hub\"]; group_id = \"g\";\n"
             "properties = [ \"sasl.password=hunter2-secret\" ];");
    assert_refused(c, ":4: kafka.properties: 'sasl.password' is set from "
                      "kafka.eventhubs_connection_string",
                   "hunter2-secret");
    ces_config_destroy(c);
}

static void invalid_values_name_the_line(void **state) {
    (void)state;
    ces_config_t *c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
                           "properties = [ \"fetch.wait.max.ms=soon\" ];");
    assert_refused(c, ":3: kafka.properties: Invalid value", NULL);
    ces_config_destroy(c);

    c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";\n"
             "properties = [ \"ssl.key.password=\" ];");
    char value[64], err[512];
    /* An empty value is a value: librdkafka takes it. */
    assert_int_equal(ces_consumer_property(c, "group.id", value, sizeof(value), err,
                                           sizeof(err)),
                     CES_CONSUMER_OK);
    ces_config_destroy(c);
}

static void unknown_property_name_is_an_error(void **state) {
    (void)state;
    ces_config_t *c = load("brokers = \"b:1\"; topics = [\"ces\"]; group_id = \"g\";");
    char value[64], err[512];
    assert_int_equal(ces_consumer_property(c, "no.such.property", value, sizeof(value), err,
                                           sizeof(err)),
                     CES_CONSUMER_CONFIG);
    assert_non_null(strstr(err, "no.such.property"));
    ces_config_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_broker_gets_ces2pg_defaults),
        cmocka_unit_test(properties_override_defaults_but_not_what_ces2pg_forces),
        cmocka_unit_test(static_membership_from_key_or_environment),
        cmocka_unit_test(eventhubs_mode_sets_sasl_and_microsofts_settings),
        cmocka_unit_test(reserved_properties_are_refused_with_file_and_line),
        cmocka_unit_test(invalid_values_name_the_line),
        cmocka_unit_test(unknown_property_name_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
