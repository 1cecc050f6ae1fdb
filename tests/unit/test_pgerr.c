/* What PostgreSQL's errors mean for ces2pg: SQLSTATE classes, failed connections, DDL races. */
#include "test_util.h"

#include "apply/apply.h"
#include "apply/pgerr.h"

typedef struct {
    const char *sqlstate;
    ces_pgerr_action_t cls;
} verdict_t;

/* With a working connection: every code and class ces2pg retries, the data classes, the stale
 * codes, and a sample of what is fatal. */
static const verdict_t table[] = {
    /* class 08, connection exception */
    {"08000", CES_PGERR_RETRY},
    {"08003", CES_PGERR_RETRY},
    {"08006", CES_PGERR_RETRY},
    {"08001", CES_PGERR_RETRY},
    {"08004", CES_PGERR_RETRY},
    {"08P01", CES_PGERR_RETRY},
    /* class 53, insufficient resources */
    {"53000", CES_PGERR_RETRY},
    {"53100", CES_PGERR_RETRY},
    {"53200", CES_PGERR_RETRY},
    {"53300", CES_PGERR_RETRY},
    {"53400", CES_PGERR_RETRY},
    /* single codes */
    {"57P01", CES_PGERR_RETRY}, /* admin_shutdown */
    {"57P02", CES_PGERR_RETRY}, /* crash_shutdown */
    {"57P03", CES_PGERR_RETRY}, /* cannot_connect_now */
    {"57014", CES_PGERR_RETRY}, /* query_canceled */
    {"40001", CES_PGERR_RETRY}, /* serialization_failure */
    {"40P01", CES_PGERR_RETRY}, /* deadlock_detected */
    {"55P03", CES_PGERR_RETRY}, /* lock_not_available */
    /* class 22, data exception */
    {"22000", CES_PGERR_DATA},
    {"22001", CES_PGERR_DATA},
    {"22003", CES_PGERR_DATA},
    {"22007", CES_PGERR_DATA},
    {"22012", CES_PGERR_DATA}, /* a division by zero that is not the fence's */
    {"22021", CES_PGERR_DATA},
    {"22P02", CES_PGERR_DATA},
    /* class 23, integrity constraint violation */
    {"23000", CES_PGERR_DATA},
    {"23502", CES_PGERR_DATA},
    {"23503", CES_PGERR_DATA},
    {"23505", CES_PGERR_DATA},
    {"23514", CES_PGERR_DATA},
    /* class 54, program limit exceeded */
    {"54000", CES_PGERR_DATA},
    {"54001", CES_PGERR_DATA},
    {"54011", CES_PGERR_DATA},
    /* stale descriptions */
    {"42P01", CES_PGERR_STALE}, /* undefined_table */
    {"42703", CES_PGERR_STALE}, /* undefined_column */
    /* everything else */
    {"42501", CES_PGERR_FATAL}, /* insufficient_privilege */
    {"28P01", CES_PGERR_FATAL}, /* invalid_password */
    {"3D000", CES_PGERR_FATAL}, /* invalid_catalog_name */
    {"42601", CES_PGERR_FATAL}, /* syntax_error */
    {"42P07", CES_PGERR_FATAL}, /* duplicate_table (a race only for idempotent DDL) */
    {"40002", CES_PGERR_FATAL}, /* class 40 is not retried as a whole */
    {"40003", CES_PGERR_FATAL},
    {"55000", CES_PGERR_FATAL}, /* class 55 neither */
    {"57000", CES_PGERR_FATAL}, /* nor class 57 */
    {"25P02", CES_PGERR_FATAL},
    {"0A000", CES_PGERR_FATAL},
    {"XX000", CES_PGERR_FATAL},
    {"21000", CES_PGERR_FATAL}, /* cardinality_violation: in a bulk one, RETRY_ROW_BY_ROW */
};

static void classification_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        ces_pgerr_action_t got = ces_pgerr_classify(table[i].sqlstate, true);
        if (got != table[i].cls)
            fail_msg("SQLSTATE %s: class %d, expected %d", table[i].sqlstate, (int)got,
                     (int)table[i].cls);
    }
}

/* Without a working connection the statement's fate is unknown: retry, whatever the code. */
static void lost_connection_is_retry(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        assert_int_equal(ces_pgerr_classify(table[i].sqlstate, false), CES_PGERR_RETRY);
    assert_int_equal(ces_pgerr_classify(NULL, false), CES_PGERR_RETRY);
}

/* libpq's own failures (a broken socket, out of memory) carry no SQLSTATE. */
static void no_sqlstate_is_retry(void **state) {
    (void)state;
    assert_int_equal(ces_pgerr_classify("", true), CES_PGERR_RETRY);
    assert_int_equal(ces_pgerr_classify(NULL, true), CES_PGERR_RETRY);
}

/* The names are PostgreSQL's, and say what they mean. */
static void names_match_errcodes(void **state) {
    (void)state;
    assert_string_equal(ERRCODE_T_R_SERIALIZATION_FAILURE, "40001");
    assert_string_equal(ERRCODE_T_R_DEADLOCK_DETECTED, "40P01");
    assert_string_equal(ERRCODE_LOCK_NOT_AVAILABLE, "55P03");
    assert_string_equal(ERRCODE_ADMIN_SHUTDOWN, "57P01");
    assert_string_equal(ERRCODE_CRASH_SHUTDOWN, "57P02");
    assert_string_equal(ERRCODE_CANNOT_CONNECT_NOW, "57P03");
    assert_string_equal(ERRCODE_QUERY_CANCELED, "57014");
    assert_string_equal(ERRCODE_DIVISION_BY_ZERO, "22012");
    assert_string_equal(ERRCODE_UNIQUE_VIOLATION, "23505");
    assert_string_equal(ERRCODE_CARDINALITY_VIOLATION, "21000");
    assert_string_equal(ERRCODE_UNDEFINED_TABLE, "42P01");
    assert_string_equal(ERRCODE_UNDEFINED_COLUMN, "42703");
    assert_string_equal(ERRCODE_DUPLICATE_TABLE, "42P07");
    assert_string_equal(ERRCODE_DUPLICATE_SCHEMA, "42P06");
    assert_string_equal(ERRCODE_DUPLICATE_COLUMN, "42701");
    assert_string_equal(ERRCODE_DUPLICATE_OBJECT, "42710");
    assert_string_equal(ERRCODE_CLASS_CONNECTION_EXCEPTION, "08");
    assert_string_equal(ERRCODE_CLASS_DATA_EXCEPTION, "22");
    assert_string_equal(ERRCODE_CLASS_INTEGRITY_CONSTRAINT_VIOLATION, "23");
    assert_string_equal(ERRCODE_CLASS_INSUFFICIENT_RESOURCES, "53");
    assert_string_equal(ERRCODE_CLASS_PROGRAM_LIMIT_EXCEEDED, "54");
}

/* A server that is not there (yet) is retried; a login or configuration it refuses is not. */
static void connect_failures(void **state) {
    (void)state;
    static const struct {
        const char *message;
        ces_pgerr_action_t cls;
    } cases[] = {
        {"connection to server on socket \"/run/postgresql/.s.PGSQL.5432\" failed: No such file "
         "or directory\n\tIs the server running locally and accepting connections on that "
         "socket?\n",
         CES_PGERR_RETRY},
        {"connection to server at \"db\" (10.0.0.7), port 5432 failed: Connection refused\n",
         CES_PGERR_RETRY},
        {"connection to server at \"db\" (10.0.0.7), port 5432 failed: timeout expired\n",
         CES_PGERR_RETRY},
        {"connection to server at \"db\", port 5432 failed: FATAL:  the database system is "
         "starting up\n",
         CES_PGERR_RETRY},
        {"could not translate host name \"db\" to address: Temporary failure in name "
         "resolution\n",
         CES_PGERR_RETRY},
        {"connection to server at \"db\", port 5432 failed: FATAL:  password authentication "
         "failed for user \"ces\"\n",
         CES_PGERR_FATAL},
        {"FATAL:  database \"nope\" does not exist\n", CES_PGERR_FATAL},
        {"FATAL:  role \"nobody\" does not exist\n", CES_PGERR_FATAL},
        {"FATAL:  no pg_hba.conf entry for host \"10.0.0.8\", user \"ces\", database \"x\"\n",
         CES_PGERR_FATAL},
        {"FATAL:  SCRAM authentication failed\n", CES_PGERR_FATAL},
        {"FATAL:  permission denied for database \"x\"\n", CES_PGERR_FATAL},
        {"invalid connection option \"colour\"\n", CES_PGERR_FATAL},
        {"missing \"=\" after \"nonsense\" in connection info string\n", CES_PGERR_FATAL},
        {"invalid sslmode value: \"sometimes\"\n", CES_PGERR_FATAL},
        {"connection to server at \"db\", port 5432 failed: SSL error: certificate verify "
         "failed\n",
         CES_PGERR_FATAL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ces_pgerr_action_t got = ces_pgerr_classify_connect_failure(cases[i].message);
        if (got != cases[i].cls)
            fail_msg("\"%s\": class %d, expected %d", cases[i].message, (int)got,
                     (int)cases[i].cls);
    }
}

/* The table of texts and the decision agree: a message holding an entry's text, alone or inside
 * libpq's wording, gets the entry's action, and one holding none is retried. */
static void connect_texts_decide(void **state) {
    (void)state;
    size_t n = 0;
    const ces_pgerr_connect_text_t *texts = ces_pgerr_connect_texts(&n);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        char message[512];
        snprintf(message, sizeof(message),
                 "connection to server at \"db\", port 5432 failed: FATAL:  %s for \"x\"\n",
                 texts[i].text);
        if (ces_pgerr_classify_connect_failure(texts[i].text) != texts[i].action ||
            ces_pgerr_classify_connect_failure(message) != texts[i].action)
            fail_msg("\"%s\": the table says %d, the decision differs", texts[i].text,
                     (int)texts[i].action);
        assert_true(texts[i].action == CES_PGERR_FATAL || texts[i].action == CES_PGERR_RETRY);
    }
    assert_int_equal(ces_pgerr_classify_connect_failure(""), CES_PGERR_RETRY);
    assert_int_equal(ces_pgerr_classify_connect_failure("server closed the connection "
                                                        "unexpectedly\n"),
                     CES_PGERR_RETRY);
}

/* What another session running the same IF NOT EXISTS DDL at the same moment makes us see. */
static void ddl_race_set(void **state) {
    (void)state;
    static const char *const raced[] = {"23505", "42P07", "42P06", "42710"};
    for (size_t i = 0; i < sizeof(raced) / sizeof(raced[0]); i++)
        assert_true(ces_pgerr_is_ddl_race(raced[i]));
    /* 42701: ADD COLUMN IF NOT EXISTS waits for the lock and sees the column; a duplicate column
     * is what the statement itself asked (a system column's name), never someone else's work. */
    static const char *const not_raced[] = {"42P01", "42703", "23502", "42501", "40P01", "42701",
                                            "",      "2350",  "235050"};
    for (size_t i = 0; i < sizeof(not_raced) / sizeof(not_raced[0]); i++) {
        if (ces_pgerr_is_ddl_race(not_raced[i]))
            fail_msg("\"%s\" taken for a DDL race", not_raced[i]);
    }
    assert_false(ces_pgerr_is_ddl_race(NULL));
}

/* An event's statement (its row change, its table's DDL): what it asks is refused, the event's. */
static const verdict_t event_table[] = {
    {"42701", CES_PGERR_DATA},  /* duplicate column in CREATE/ALTER TABLE */
    {"42939", CES_PGERR_DATA},  /* reserved name */
    {"42501", CES_PGERR_DATA},  /* a target table ces2pg may not alter or write (apply checks
                                 * its own schema) */
    {"42P16", CES_PGERR_DATA},  /* invalid table definition */
    {"42804", CES_PGERR_DATA},  /* datatype mismatch */
    {"42846", CES_PGERR_DATA},  /* cannot coerce */
    {"42601", CES_PGERR_DATA},  /* syntax error */
    {"42P07", CES_PGERR_DATA},  /* a relation of that name */
    {"428C9", CES_PGERR_DATA},  /* a generated column written */
    {"0A000", CES_PGERR_DATA},  /* feature not supported */
    {"P0001", CES_PGERR_DATA},  /* a trigger's RAISE EXCEPTION */
    {"21000", CES_PGERR_DATA},  /* cardinality */
    {"55000", CES_PGERR_DATA},  /* object not in prerequisite state (a replica identity) */
    {"22P02", CES_PGERR_DATA},  /* data, as before */
    {"23514", CES_PGERR_DATA},  /* a CHECK constraint */
    /* transient and stale: unchanged */
    {"40001", CES_PGERR_RETRY},
    {"55P03", CES_PGERR_RETRY},
    {"57014", CES_PGERR_RETRY},
    {"57P01", CES_PGERR_RETRY},
    {"08006", CES_PGERR_RETRY},
    {"53100", CES_PGERR_RETRY},
    {"42P01", CES_PGERR_STALE},
    {"42703", CES_PGERR_STALE},
    /* about ces2pg itself: they stop it */
    {"25006", CES_PGERR_FATAL}, /* read-only transaction: a standby */
    {"25P02", CES_PGERR_FATAL},
    {"28000", CES_PGERR_FATAL},
    {"28P01", CES_PGERR_FATAL},
    {"3D000", CES_PGERR_FATAL},
    {"3B001", CES_PGERR_FATAL}, /* its own savepoint */
    {"57P04", CES_PGERR_FATAL}, /* database dropped */
    {"58030", CES_PGERR_FATAL},
    {"F0000", CES_PGERR_FATAL},
    {"XX000", CES_PGERR_FATAL},
};

static void event_classification_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(event_table) / sizeof(event_table[0]); i++) {
        ces_pgerr_action_t got = ces_pgerr_classify_event(event_table[i].sqlstate, true);
        if (got != event_table[i].cls)
            fail_msg("SQLSTATE %s of an event: class %d, expected %d", event_table[i].sqlstate,
                     (int)got, (int)event_table[i].cls);
        assert_int_equal(ces_pgerr_classify_event(event_table[i].sqlstate, false),
                         CES_PGERR_RETRY);
    }
    assert_int_equal(ces_pgerr_classify_event(NULL, true), CES_PGERR_RETRY);
    assert_int_equal(ces_pgerr_classify_event("", true), CES_PGERR_RETRY);
}

/* Blaming the event changes only what would stop ces2pg and is not about ces2pg. */
static void blame_event_keeps_other_actions(void **state) {
    (void)state;
    ces_pgerr_t e = CES_PGERR_INIT;
    ces_pgerr_set(&e, CES_PGERR_FATAL, -1, "42701", "column \"xmin\" already exists");
    ces_pgerr_blame_event(&e);
    assert_int_equal(e.action, CES_PGERR_DATA);
    assert_int_equal(e.failed_item, -1);
    ces_pgerr_clear(&e);
    ces_pgerr_set(&e, CES_PGERR_FATAL, -1, "57P04", "database dropped");
    ces_pgerr_blame_event(&e);
    assert_int_equal(e.action, CES_PGERR_FATAL);
    ces_pgerr_clear(&e);
    ces_pgerr_set(&e, CES_PGERR_FATAL, -1, NULL, "out of memory"); /* no SQLSTATE: ces2pg's */
    ces_pgerr_blame_event(&e);
    assert_int_equal(e.action, CES_PGERR_FATAL);
    ces_pgerr_clear(&e);
    ces_pgerr_set(&e, CES_PGERR_STALE, 2, "42703", "column does not exist");
    ces_pgerr_blame_event(&e);
    assert_int_equal(e.action, CES_PGERR_STALE);
    ces_pgerr_clear(&e);
    ces_pgerr_set(&e, CES_PGERR_RETRY, 2, "40P01", "deadlock");
    ces_pgerr_blame_event(&e);
    assert_int_equal(e.action, CES_PGERR_RETRY);
}

/* The retry counter's labels: each a reason apply.h lists. */
static void retry_reasons(void **state) {
    (void)state;
    static const struct {
        ces_pgerr_action_t action;
        const char *sqlstate, *reason;
    } cases[] = {
        {CES_PGERR_RETRY, "40001", "conflict"},   {CES_PGERR_RETRY, "40P01", "conflict"},
        {CES_PGERR_RETRY, "55P03", "timeout"},    {CES_PGERR_RETRY, "57014", "timeout"},
        {CES_PGERR_RETRY, "53300", "resources"},  {CES_PGERR_RETRY, "57P01", "connection"},
        {CES_PGERR_RETRY, "08006", "connection"}, {CES_PGERR_RETRY, NULL, "connection"},
        {CES_PGERR_STALE, "42703", "table_changed"},
    };
    static const char *const known[] = CES_APPLY_RETRY_REASONS;
    assert_int_equal(sizeof(known) / sizeof(known[0]), CES_APPLY_NRETRY_REASONS);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ces_pgerr_t e = CES_PGERR_INIT;
        ces_pgerr_set(&e, cases[i].action, -1, cases[i].sqlstate, "x");
        const char *got = ces_pgerr_retry_reason(&e);
        assert_string_equal(got, cases[i].reason);
        bool listed = false;
        for (size_t k = 0; k < CES_APPLY_NRETRY_REASONS; k++)
            listed = listed || strcmp(known[k], got) == 0;
        assert_true(listed);
    }
}

static void only_data_errors_undo_only_the_step(void **state) {
    (void)state;
    assert_true(ces_pgerr_undoes_only_the_step(CES_PGERR_DATA));
    assert_true(ces_pgerr_undoes_only_the_step(CES_PGERR_RETRY_ROW_BY_ROW));
    assert_true(ces_pgerr_undoes_only_the_step(CES_PGERR_RETRY_WITH_UPSERTS));
    assert_false(ces_pgerr_undoes_only_the_step(CES_PGERR_NONE));
    assert_false(ces_pgerr_undoes_only_the_step(CES_PGERR_RETRY));
    assert_false(ces_pgerr_undoes_only_the_step(CES_PGERR_STALE));
    assert_false(ces_pgerr_undoes_only_the_step(CES_PGERR_FENCED));
    assert_false(ces_pgerr_undoes_only_the_step(CES_PGERR_FATAL));
}

/* The first error is kept (later ones are its consequences); the message loses libpq's newline. */
static void record_keeps_the_first_error(void **state) {
    (void)state;
    ces_pgerr_t e = CES_PGERR_INIT;
    assert_int_equal(e.action, CES_PGERR_NONE);
    assert_int_equal(e.failed_item, -1);
    ces_pgerr_set(&e, CES_PGERR_DATA, 7, "22P02", "invalid input syntax for type %s \n", "integer");
    ces_pgerr_set(&e, CES_PGERR_RETRY, -1, NULL, "current transaction is aborted");
    assert_int_equal(e.action, CES_PGERR_DATA);
    assert_int_equal(e.failed_item, 7);
    assert_string_equal(e.sqlstate, "22P02");
    assert_string_equal(e.message, "invalid input syntax for type integer");
    ces_pgerr_clear(&e);
    assert_int_equal(e.action, CES_PGERR_NONE);
    assert_int_equal(e.failed_item, -1);
    ces_pgerr_set(&e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    assert_string_equal(e.sqlstate, "");
}

/* Without a result, the error is the connection's: a connection that never opened is retried. */
static void error_of_a_failed_connection(void **state) {
    (void)state;
    PGconn *conn = PQconnectdb("host=/nonexistent/ces2pg-test-socket-dir port=1");
    assert_non_null(conn);
    assert_int_not_equal(PQstatus(conn), CONNECTION_OK);
    ces_pgerr_t e = CES_PGERR_INIT;
    ces_pgerr_from_result(&e, conn, NULL, 3);
    assert_int_equal(e.action, CES_PGERR_RETRY);
    assert_int_equal(e.failed_item, 3);
    assert_string_equal(e.sqlstate, "");
    assert_non_null(strstr(e.message, "/nonexistent/ces2pg-test-socket-dir"));
    PQfinish(conn);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(classification_table),
                                       cmocka_unit_test(lost_connection_is_retry),
                                       cmocka_unit_test(no_sqlstate_is_retry),
                                       cmocka_unit_test(names_match_errcodes),
                                       cmocka_unit_test(connect_failures),
                                       cmocka_unit_test(connect_texts_decide),
                                       cmocka_unit_test(ddl_race_set),
                                       cmocka_unit_test(event_classification_table),
                                       cmocka_unit_test(blame_event_keeps_other_actions),
                                       cmocka_unit_test(retry_reasons),
                                       cmocka_unit_test(only_data_errors_undo_only_the_step),
                                       cmocka_unit_test(record_keeps_the_first_error),
                                       cmocka_unit_test(error_of_a_failed_connection)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
