/* The configuration file: every error names the file, the line and the key. */
#include "test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/config.h"

static char path[64];

static void write_config(const char *text) {
    strcpy(path, "/tmp/ces2pg-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static const char *valid =
    "kafka = {\n"
    "  brokers = \"127.0.0.1:9092\";\n"
    "  topics = [ \"ces\", \"ces2\" ];\n"
    "  group_id = \"g1\";\n"
    "  properties = [ \"fetch.wait.max.ms=50\", \"sasl.password=hunter2\" ];\n"
    "};\n"
    "postgres = { conninfo = \"host=localhost dbname=x\"; };\n"
    "apply = { batch_max_events = 10; };\n"
    "schema = { auto_create = false; };\n";

static void loads_valid_file_with_defaults(void **state) {
    (void)state;
    write_config(valid);
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    assert_string_equal(c->kafka_brokers, "127.0.0.1:9092");
    assert_int_equal(c->kafka_topics.count, 2);
    assert_string_equal(c->kafka_topics.items[1], "ces2");
    assert_string_equal(c->kafka_group_id, "g1");
    assert_int_equal(c->kafka_properties.count, 2);
    assert_int_equal(c->kafka_properties.lines[0], 5);
    assert_int_equal(c->apply_batch_max_events, 10);
    assert_int_equal(c->apply_batch_max_ms, 100); /* default */
    assert_false(c->schema_auto_create);
    assert_true(c->schema_auto_evolve);
    assert_string_equal(c->schema_metadata, "ces2pg");
    assert_string_equal(c->log_level, "info");

    /* Effective settings are printed without secrets. */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ces_config_print(c, mem);
    fclose(mem);
    assert_null(strstr(text, "hunter2"));
    assert_null(strstr(text, "dbname=x"));
    assert_non_null(strstr(text, "sasl.password=(secret)"));
    assert_non_null(strstr(text, "fetch.wait.max.ms=50"));
    free(text);
    ces_config_destroy(c);
    unlink(path);
}

/* Loads text and expects an error mentioning every needle (with the path prefixed to the first). */
static void expect_error(const char *text, ces_config_mode_t mode, const char *where,
                         const char *what) {
    write_config(text);
    ces_config_t *c = (ces_config_t *)1;
    char err[512];
    assert_int_equal(ces_config_load(path, mode, &c, err, sizeof(err)), CES_CONFIG_ERROR);
    assert_null(c);
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "%s:%s", path, where);
    if (strncmp(err, prefix, strlen(prefix)) != 0 || strstr(err, what) == NULL)
        fail_msg("error '%s' should start with '%s' and mention '%s'", err, prefix, what);
    unlink(path);
}

static void errors_name_file_line_and_key(void **state) {
    (void)state;
    expect_error("kafka = {\n brokerz = \"x\";\n};\n", CES_CONFIG_DAEMON, "2:",
                 "unknown key 'kafka.brokerz'");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; };\nfoo = { bar = 1; };\n"
                 "postgres = { conninfo = \"\"; };\n",
                 CES_CONFIG_DAEMON, "2:", "unknown key 'foo'");
    expect_error("kafka = { brokers = \"x\";\n topics = \"ces\"; };\npostgres = { conninfo = \"\"; };\n",
                 CES_CONFIG_DAEMON, "2:", "kafka.topics must be a list of strings");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; };\n", CES_CONFIG_DAEMON, "1:",
                 "missing required key 'postgres.conninfo'");
    expect_error("postgres = { conninfo = \"\"; };\n", CES_CONFIG_DAEMON, "1:",
                 "missing required key 'kafka.brokers'");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; };\npostgres = { conninfo = \"\"; };\n"
                 "apply = {\n batch_max_events = 0; };\n",
                 CES_CONFIG_DAEMON, "4:", "apply.batch_max_events = 0 is out of range");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"];\n properties = [\"novalue\"]; };\n"
                 "postgres = { conninfo = \"\"; };\n",
                 CES_CONFIG_DAEMON, "2:", "'novalue' is not of the form name=value");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; };\npostgres = { conninfo = \"\"; };\n"
                 "log = { level = \"loud\"; };\n",
                 CES_CONFIG_DAEMON, "3:", "log.level must be one of");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; };\npostgres = { conninfo = \"\"; };\n"
                 "apply = { reorder_window_ms = 400;\n reorder_window_max_ms = 300; };\n",
                 CES_CONFIG_DAEMON, "4:", "apply.reorder_window_max_ms (300) is below");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"]; group_instance_id = \"host:ces2pg\"; "
                 "};\npostgres = { conninfo = \"\"; };\n",
                 CES_CONFIG_DAEMON, "", "kafka.group_instance_id (or $CES2PG_GROUP_INSTANCE_ID) "
                 "must be 1 to 249 letters");
    expect_error("kafka = { brokers = \"x\"; topics = [\"t\"];\n on_source_gap = \"skip\"; };\n"
                 "postgres = { conninfo = \"\"; };\n",
                 CES_CONFIG_DAEMON, "2:", "kafka.on_source_gap must be \"stop\" or \"continue\"");
    expect_error("kafka = { brokers = ; };\n", CES_CONFIG_DAEMON, "1:",
                 "syntax error");
    expect_error("kafka = \"x\";\n", CES_CONFIG_DAEMON, "1:", "'kafka' must be a group");
}

/* The reorder window: 200 ms growing up to 5 s by default; a start above that raises the maximum
 * unless the maximum is given. */
static void reorder_window_defaults(void **state) {
    (void)state;
    static const struct {
        const char *apply;
        int64_t start, max;
        bool adaptive;
    } cases[] = {
        {"", 200, 5000, true},
        {"reorder_window_ms = 8000;", 8000, 8000, true},
        {"reorder_window_ms = 100; reorder_window_max_ms = 100; reorder_window_adaptive = false;",
         100, 100, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 "kafka = { brokers = \"x\"; topics = [\"t\"]; };\n"
                 "postgres = { conninfo = \"dbname=x\"; };\napply = { %s };\n",
                 cases[i].apply);
        write_config(text);
        ces_config_t *c = NULL;
        char err[512];
        assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                         CES_CONFIG_OK);
        assert_int_equal(c->apply_reorder_window_ms, cases[i].start);
        assert_int_equal(c->apply_reorder_window_max_ms, cases[i].max);
        assert_int_equal(c->apply_reorder_window_adaptive, cases[i].adaptive);
        ces_config_destroy(c);
        unlink(path);
    }
}

static void replay_needs_no_kafka(void **state) {
    (void)state;
    write_config("postgres = { conninfo = \"dbname=x\"; };\n");
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_REPLAY, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    ces_config_destroy(c);
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                     CES_CONFIG_ERROR);
    unlink(path);
}

static void missing_file(void **state) {
    (void)state;
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load("/nonexistent/ces2pg.conf", CES_CONFIG_DAEMON, &c, err,
                                     sizeof(err)),
                     CES_CONFIG_ERROR);
    assert_non_null(strstr(err, "/nonexistent/ces2pg.conf"));
}

/* The read-only view of the key table (what ces2pg.conf(5) is generated from) says what the
 * loader does: every default it gives is the value a file without that key gets. */
static void key_table_view_matches_the_loader(void **state) {
    (void)state;
    write_config("kafka = { brokers = \"b:9092\"; topics = [ \"t\" ]; };\n"
                 "postgres = { conninfo = \"dbname=x\"; };\n");
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    char *printed = NULL;
    size_t printed_len = 0;
    FILE *mem = open_memstream(&printed, &printed_len);
    fputc('\n', mem); /* so that every line, the first too, starts after a newline */
    ces_config_print(c, mem);
    fclose(mem);
    size_t n = ces_config_key_count();
    assert_true(n > 40);
    size_t lines = 0;
    for (const char *p = printed; *p != '\0'; p++)
        lines += *p == '\n';
    assert_int_equal(lines, n + 1); /* one line per key of the table, and no other */
    for (size_t i = 0; i < n; i++) {
        ces_config_key_info_t info;
        assert_true(ces_config_key_info(i, &info));
        for (size_t j = 0; j < i; j++) {
            ces_config_key_info_t other;
            assert_true(ces_config_key_info(j, &other));
            assert_string_not_equal(info.name, other.name);
        }
        assert_non_null(strchr(info.name, '.'));
        assert_int_equal(info.has_range, strcmp(info.type, "integer") == 0);
        if (info.has_range)
            assert_true(info.min <= info.max);
        if (info.default_value == NULL || strcmp(info.name, "apply.reorder_window_max_ms") == 0)
            continue; /* the one default settled from another key; tested above */
        char want[256];
        if (strcmp(info.type, "string") == 0)
            snprintf(want, sizeof(want), "\n%s = \"%s\"\n", info.name, info.default_value);
        else
            snprintf(want, sizeof(want), "\n%s = %s\n", info.name, info.default_value);
        if (strstr(printed, want) == NULL)
            fail_msg("the table's default of %s is not what the loader gives:\n%s", info.name,
                     printed);
    }
    ces_config_key_info_t past;
    assert_false(ces_config_key_info(n, &past));
    free(printed);
    ces_config_destroy(c);
    unlink(path);
}

/* Each semantic check names the line of the key it refuses (one helper finds it). */
static void checks_name_the_line_of_their_key(void **state) {
    (void)state;
    static const struct {
        const char *group, *setting, *what;
    } cases[] = {
        {"kafka", "format = \"xml\";", "kafka.format must be"},
        {"apply", "ordering = \"random\";", "apply.ordering must be"},
        {"apply", "tombstone_retention = \"soon\";", "apply.tombstone_retention must be"},
        {"apply", "version_column = \"\";", "apply.version_column must be 1 to 63 bytes"},
        {"schema", "target = \"nodot\";", "schema.target must be SCHEMA.TABLE"},
        {"schema", "target = \"s.{tbl}\";", "schema.target has an unknown placeholder at '{tbl}'"},
        {"schema", "identifier_case = \"upper\";", "schema.identifier_case must be"},
        {"log", "format = \"xml\";", "log.format must be"},
        {"http", "listen = \"nowhere\";", "http.listen must be \"HOST:PORT\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        /* The setting is on line 4, its group opens on line 3. */
        char text[512];
        if (strcmp(cases[i].group, "kafka") == 0)
            snprintf(text, sizeof(text),
                     "postgres = { conninfo = \"\"; };\n\nkafka = { brokers = \"x\"; topics = "
                     "[\"t\"];\n %s };\n",
                     cases[i].setting);
        else
            snprintf(text, sizeof(text),
                     "kafka = { brokers = \"x\"; topics = [\"t\"]; };\npostgres = { conninfo = "
                     "\"\"; };\n%s = {\n %s };\n",
                     cases[i].group, cases[i].setting);
        expect_error(text, CES_CONFIG_DAEMON, "4:", cases[i].what);
    }
}

#define RULES_BASE                                                                                 \
    "kafka = { brokers = \"x\"; topics = [\"t\"]; };\npostgres = { conninfo = \"\"; };\n"

/* schema.tables: rules tried in order, the first match wins, a table no rule matches gets the
 * defaults; every key a rule holds is known, and each mistake names its line. */
static void table_rules_match_in_order(void **state) {
    (void)state;
    write_config(RULES_BASE "schema = { tables = (\n"
                            "  { match = \"dbo.Orders\"; target = \"sales.orders\"; },\n"
                            "  { match = \"audit.*\"; deletes = \"soft\"; },\n"
                            "  { match = \"dbo.*\"; deletes = \"soft\"; deleted_column = \"gone\";"
                            " history = \"also\"; },\n"
                            "  { match = \"log.*\"; history = \"only\"; history_table = \"h.{table}\";"
                            " columns = { include = [\"Id\", \"Msg\", \"At\"]; rename = ( [\"Msg\", \"text\"] );"
                            " types = ( [\"Msg\", \"jsonb\"], [\"At\", \"timestamptz\", \"UTC\"] ); }; }\n"
                            "); };\n");
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    assert_int_equal(c->schema_tables.count, 4);
    const ces_rule_t *r = ces_rules_match(&c->schema_tables, "DBO", "orders");
    assert_non_null(r); /* ASCII case does not matter, as in schema.include */
    assert_int_equal(r->line, 4);
    assert_string_equal(r->target, "sales.orders");
    assert_int_equal(r->deletes, CES_RULE_DELETES_HARD);
    assert_null(r->deleted_column);
    r = ces_rules_match(&c->schema_tables, "audit", "Log");
    assert_non_null(r);
    assert_null(r->target);
    assert_int_equal(r->deletes, CES_RULE_DELETES_SOFT);
    assert_string_equal(r->deleted_column, "_ces_deleted_at");
    r = ces_rules_match(&c->schema_tables, "dbo", "Customers");
    assert_non_null(r);
    assert_string_equal(r->deleted_column, "gone");
    assert_int_equal(r->history, CES_RULE_HISTORY_ALSO);
    assert_string_equal(r->history_table, "{schema}.{table}_history");
    r = ces_rules_match(&c->schema_tables, "log", "events");
    assert_int_equal(r->history, CES_RULE_HISTORY_ONLY);
    assert_string_equal(r->history_table, "h.{table}");
    assert_int_equal(r->include.count, 3);
    assert_int_equal(r->types.count, 2);
    assert_string_equal(r->type_zones.items[0], "");
    assert_string_equal(r->type_zones.items[1], "UTC");
    assert_string_equal(r->rename_to.items[0], "text");
    assert_null(ces_rules_match(&c->schema_tables, "sales", "Orders"));

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ces_rules_describe(mem, &c->schema_tables, c->schema_target);
    fclose(mem);
    assert_non_null(strstr(text, "tables: table dbo.Orders (line 4): target sales.orders, "
                                 "deletes hard\n"));
    assert_non_null(strstr(text, "deletes soft (a delete keeps the row and sets gone to the commit "
                                 "time), every change also in {schema}.{table}_history\n"));
    assert_non_null(strstr(text, "tables: pattern log.* (line 7): history only, in h.{table} "
                                 "(append only, no mirror), only the columns Id, Msg, At, renaming "
                                 "Msg as text, typing Msg as jsonb, At as timestamptz at UTC\n"));
    assert_non_null(strstr(text, "tables: pattern audit.* (line 5): target {schema}.{table}, "
                                 "deletes soft (a delete keeps the row and sets _ces_deleted_at"));
    assert_non_null(strstr(text, "tables: any other table: target {schema}.{table}, deletes "
                                 "hard\n"));
    free(text);
    ces_config_destroy(c);
    unlink(path);
}

static void table_rule_mistakes_are_errors(void **state) {
    (void)state;
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; mask = \"x\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "unknown key 'mask' in a rule (a rule holds: match,");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; history = \"on\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "history must be \"off\", \"also\"");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; history_table = \"h.a\"; "
                            "}\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "history_table names the history table: it needs");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; history = \"only\"; "
                            "deletes = \"soft\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "with history = \"only\" there is no mirror table");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; history = \"also\"; "
                            "target = \"h.a\"; history_table = \"h.a\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "history_table must differ from target");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; history = \"also\"; "
                            "history_table = \"nodot\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "history_table must be SCHEMA.TABLE");
    expect_error(RULES_BASE "schema = { tables = (\n { target = \"a.b\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "a rule needs match = ");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; deletes = \"later\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "deletes must be \"hard\" or \"soft\"");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; deleted_column = \"d\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "deleted_column is the column a soft delete sets");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; target = \"nodot\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "target must be SCHEMA.TABLE");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; target = \"{x}.t\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "target has an unknown placeholder at '{x}.t'");
    expect_error(RULES_BASE "schema = { tables = (\n { match = 5; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "'match' must be a string");
    /* (libconfig gives a string in a list the line its list ends on.) */
    expect_error(RULES_BASE "schema = { tables = (\n \"dbo.a\"\n); };\n",
                 CES_CONFIG_DAEMON, "", "each rule must be a group");
    expect_error(RULES_BASE "schema = {\n tables = { match = \"dbo.a\"; }; };\n",
                 CES_CONFIG_DAEMON, "4:", "must be a list of rules");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.*\"; },\n"
                            " { match = \"DBO.Orders\"; target = \"s.o\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "5:", "the rule for 'DBO.Orders' never applies: the rule of line 4");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.*\"; },\n"
                            " { match = \"dbo.ord*\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "5:", "never applies");
    expect_error(RULES_BASE "apply = { version_column = \"v\"; };\n"
                            "schema = { tables = (\n { match = \"dbo.a\"; deletes = \"soft\"; "
                            "deleted_column = \"v\"; }\n); };\n",
                 CES_CONFIG_DAEMON, "5:", "deleted_column may not be the version column");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { hide = [\"C\"]; "
                            "}; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:",
                 "unknown key 'hide' in columns (columns hold: include, exclude, rename, types, mask)");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { include = "
                            "[\"A\"]; exclude = [\"B\"]; }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "give include or exclude, not both");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { rename = "
                            "( [\"A\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "rename is a list of pairs");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { exclude = "
                            "[\"A\"]; rename = ( [\"a\", \"b\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "a renamed column must be one that goes");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { rename = "
                            "( [\"A\", \"x\"], [\"B\", \"X\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "two columns are renamed to one name");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { include = "
                            "[\"\"]; }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "a column name must be a non-empty string");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { types = "
                            "( [\"P\", \"xml\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "types is a list:");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { types = "
                            "( [\"C\", \"timestamptz\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "timestamptz (with the zone of the source's local times)");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { types = "
                            "( [\"C\", \"timestamptz\", \"Berlin; DROP\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "a zone is a name like");
    expect_error(RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { exclude = "
                            "[\"P\"]; types = ( [\"p\", \"jsonb\"] ); }; }\n); };\n",
                 CES_CONFIG_DAEMON, "4:", "a column given a type must be one that goes");
    /* A narrower rule first is what "the first match wins" asks for. */
    write_config(RULES_BASE "schema = { tables = (\n { match = \"dbo.ord*\"; },\n"
                            " { match = \"dbo.*\"; }\n); };\n");
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    assert_int_equal(ces_rules_match(&c->schema_tables, "dbo", "orders")->line, 4);
    assert_int_equal(ces_rules_match(&c->schema_tables, "dbo", "items")->line, 5);
    ces_config_destroy(c);
    unlink(path);
}

/* A key file for schema.mask_key_file holding text, with mode; its path in key_path. */
static char key_path[64];
static void write_key(const char *text, mode_t mode) {
    strcpy(key_path, "/tmp/ces2pg-key-XXXXXX");
    int fd = mkstemp(key_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

/* columns.mask: its shape, what it may not be combined with, and the key a hash needs, read from
 * a private file and never quoted. */
static void masks_and_their_key(void **state) {
    (void)state;
    char text[1024];
#define MASK_RULE(masks) RULES_BASE "schema = { tables = (\n { match = \"dbo.a\"; columns = { " masks " }; }\n); };\n"
    expect_error(MASK_RULE("mask = [\"C\"];"), CES_CONFIG_DAEMON, "4:", "mask is a list of pairs");
    expect_error(MASK_RULE("mask = ( [\"C\", \"md5\"] );"), CES_CONFIG_DAEMON, "4:",
                 "\"hash\" is a keyed hash (schema.mask_key_file)");
    expect_error(MASK_RULE("mask = ( [\"C\", \"null\"], [\"c\", \"hash\"] );"), CES_CONFIG_DAEMON,
                 "4:", "a column is masked twice");
    expect_error(MASK_RULE("exclude = [\"C\"]; mask = ( [\"c\", \"null\"] );"), CES_CONFIG_DAEMON,
                 "4:", "a masked column must be one that goes");
    expect_error(MASK_RULE("mask = ( [\"C\", \"null\"] ); types = ( [\"c\", \"jsonb\"] );"),
                 CES_CONFIG_DAEMON, "4:", "a masked column cannot also be given a type");
    expect_error(MASK_RULE("mask = ( [\"C\", \"hash\"] );"), CES_CONFIG_DAEMON, "3:",
                 "a rule masks a column by \"hash\", which needs schema.mask_key_file");

    const char *secret = "0123456789abcdef-never-shown";
    write_key(secret, 0644);
    snprintf(text, sizeof(text),
             RULES_BASE "schema = { mask_key_file = \"%s\"; tables = (\n { match = \"dbo.a\"; "
                        "columns = { mask = ( [\"C\", \"hash\"] ); }; }\n); };\n",
             key_path);
    ces_config_t *c = NULL;
    char err[512];
    write_config(text);
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)), CES_CONFIG_ERROR);
    assert_non_null(strstr(err, "readable by its group or others"));
    assert_null(strstr(err, "never-shown"));
    unlink(key_path);
    unlink(path);

    write_key("short\n", 0600);
    snprintf(text, sizeof(text), RULES_BASE "schema = { mask_key_file = \"%s\"; };\n", key_path);
    write_config(text);
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)), CES_CONFIG_ERROR);
    assert_non_null(strstr(err, "schema.mask_key_file: the key must be one line of at least 16"));
    assert_null(strstr(err, "short"));
    unlink(key_path);
    unlink(path);

    write_key("0123456789abcdef-never-shown\n", 0600);
    snprintf(text, sizeof(text),
             RULES_BASE "schema = { mask_key_file = \"%s\"; tables = (\n { match = \"dbo.a\"; "
                        "columns = { mask = ( [\"C\", \"hash\"], [\"D\", \"null\"] ); }; }\n); };\n",
             key_path);
    write_config(text);
    assert_int_equal(ces_config_load(path, CES_CONFIG_DAEMON, &c, err, sizeof(err)), CES_CONFIG_OK);
    assert_string_equal(c->schema_mask_key, secret);
    const ces_rule_t *r = ces_rules_match(&c->schema_tables, "dbo", "a");
    assert_int_equal(r->mask_columns.count, 2);
    assert_string_equal(r->masks.items[1], "null");
    char *described = NULL;
    size_t described_len = 0;
    FILE *out = open_memstream(&described, &described_len);
    ces_rules_describe(out, &c->schema_tables, "{schema}.{table}");
    fclose(out);
    assert_non_null(strstr(described, "masking C by keyed hash, D as NULL"));
    free(described);
    ces_config_destroy(c);
    unlink(key_path);
    unlink(path);
#undef MASK_RULE
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loads_valid_file_with_defaults),
        cmocka_unit_test(errors_name_file_line_and_key),
        cmocka_unit_test(reorder_window_defaults),
        cmocka_unit_test(replay_needs_no_kafka),
        cmocka_unit_test(missing_file),
        cmocka_unit_test(key_table_view_matches_the_loader),
        cmocka_unit_test(checks_name_the_line_of_their_key),
        cmocka_unit_test(table_rules_match_in_order),
        cmocka_unit_test(table_rule_mistakes_are_errors),
        cmocka_unit_test(masks_and_their_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
