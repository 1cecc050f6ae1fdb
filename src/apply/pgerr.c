#include "apply/pgerr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SQLSTATE_CLASS_LEN 2

static const char *const retry_classes[] = {ERRCODE_CLASS_CONNECTION_EXCEPTION,
                                            ERRCODE_CLASS_INSUFFICIENT_RESOURCES};
static const char *const retry_codes[] = {
    ERRCODE_ADMIN_SHUTDOWN,         ERRCODE_CRASH_SHUTDOWN,         ERRCODE_CANNOT_CONNECT_NOW,
    ERRCODE_QUERY_CANCELED,         ERRCODE_T_R_SERIALIZATION_FAILURE,
    ERRCODE_T_R_DEADLOCK_DETECTED,  ERRCODE_LOCK_NOT_AVAILABLE};
/* A change PostgreSQL rejects for what it holds: the change is dead-lettered. */
static const char *const data_classes[] = {ERRCODE_CLASS_DATA_EXCEPTION,
                                           ERRCODE_CLASS_INTEGRITY_CONSTRAINT_VIOLATION,
                                           ERRCODE_CLASS_PROGRAM_LIMIT_EXCEEDED};
/* A cached table description no longer matches the server's. */
static const char *const stale_codes[] = {ERRCODE_UNDEFINED_TABLE, ERRCODE_UNDEFINED_COLUMN};
/* Not 42701 (duplicate column): ADD COLUMN IF NOT EXISTS waits for the table's lock and then
 * sees a column another session added, so a duplicate column is what the statement itself asks
 * (a system column's name, one name twice), never a race. */
static const char *const ddl_race_codes[] = {ERRCODE_UNIQUE_VIOLATION, ERRCODE_DUPLICATE_TABLE,
                                             ERRCODE_DUPLICATE_SCHEMA, ERRCODE_DUPLICATE_OBJECT};
/* Errors of an event's statement that are about ces2pg itself, not the event: they stop it. */
static const char *const own_classes[] = {
    ERRCODE_CLASS_INVALID_TRANSACTION_STATE, ERRCODE_CLASS_INVALID_AUTHORIZATION,
    ERRCODE_CLASS_INVALID_CATALOG_NAME,      ERRCODE_CLASS_SAVEPOINT_EXCEPTION,
    ERRCODE_CLASS_OPERATOR_INTERVENTION,     ERRCODE_CLASS_SYSTEM_ERROR,
    ERRCODE_CLASS_CONFIG_FILE_ERROR,         ERRCODE_CLASS_INTERNAL_ERROR};

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static bool in_list(const char *sqlstate, const char *const *codes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(sqlstate, codes[i]) == 0)
            return true;
    }
    return false;
}

static bool in_classes(const char *sqlstate, const char *const *classes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (strncmp(sqlstate, classes[i], SQLSTATE_CLASS_LEN) == 0)
            return true;
    }
    return false;
}

void ces_pgerr_set(ces_pgerr_t *e, ces_pgerr_action_t action, long item, const char *sqlstate,
                   const char *fmt, ...) {
    if (e->action != CES_PGERR_NONE)
        return;
    e->action = action;
    e->failed_item = item;
    snprintf(e->sqlstate, sizeof(e->sqlstate), "%s", sqlstate ? sqlstate : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    size_t n = strlen(e->message);
    while (n > 0 && (e->message[n - 1] == '\n' || e->message[n - 1] == ' '))
        e->message[--n] = '\0';
}

void ces_pgerr_from_result(ces_pgerr_t *e, const PGconn *conn, const PGresult *res, long item) {
    const char *sqlstate = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(conn);
    if (msg == NULL || msg[0] == '\0')
        msg = PQerrorMessage(conn);
    ces_pgerr_set(e, ces_pgerr_classify(sqlstate, PQstatus(conn) == CONNECTION_OK), item, sqlstate,
                  "%s", msg);
}

void ces_pgerr_clear(ces_pgerr_t *e) { *e = (ces_pgerr_t)CES_PGERR_INIT; }

ces_pgerr_action_t ces_pgerr_classify(const char *sqlstate, bool connection_ok) {
    if (!connection_ok || sqlstate == NULL || sqlstate[0] == '\0')
        return CES_PGERR_RETRY;
    if (in_classes(sqlstate, retry_classes, COUNT(retry_classes)) ||
        in_list(sqlstate, retry_codes, COUNT(retry_codes)))
        return CES_PGERR_RETRY;
    if (in_classes(sqlstate, data_classes, COUNT(data_classes)))
        return CES_PGERR_DATA;
    if (in_list(sqlstate, stale_codes, COUNT(stale_codes)))
        return CES_PGERR_STALE;
    return CES_PGERR_FATAL;
}

ces_pgerr_action_t ces_pgerr_classify_event(const char *sqlstate, bool connection_ok) {
    ces_pgerr_action_t action = ces_pgerr_classify(sqlstate, connection_ok);
    if (action != CES_PGERR_FATAL || in_classes(sqlstate, own_classes, COUNT(own_classes)))
        return action;
    return CES_PGERR_DATA;
}

const char *ces_pgerr_retry_reason(const ces_pgerr_t *e) {
    static const char *const conflict_codes[] = {ERRCODE_T_R_SERIALIZATION_FAILURE,
                                                 ERRCODE_T_R_DEADLOCK_DETECTED};
    static const char *const timeout_codes[] = {ERRCODE_LOCK_NOT_AVAILABLE,
                                                ERRCODE_QUERY_CANCELED};
    static const char *const resource_classes[] = {ERRCODE_CLASS_INSUFFICIENT_RESOURCES};
    if (e->action == CES_PGERR_STALE)
        return "table_changed";
    if (in_list(e->sqlstate, conflict_codes, COUNT(conflict_codes)))
        return "conflict";
    if (in_list(e->sqlstate, timeout_codes, COUNT(timeout_codes)))
        return "timeout";
    if (in_classes(e->sqlstate, resource_classes, COUNT(resource_classes)))
        return "resources";
    return "connection";
}

void ces_pgerr_blame_event(ces_pgerr_t *e) {
    if (e->action == CES_PGERR_FATAL && e->sqlstate[0] != '\0')
        e->action = ces_pgerr_classify_event(e->sqlstate, true);
}

/* Texts of a failed connection's message that make it not worth retrying: the server's refusals
 * (with the SQLSTATE libpq does not keep), then libpq's own failures, which have none. */
static const ces_pgerr_connect_text_t connect_texts[] = {
    {"password authentication failed", CES_PGERR_FATAL}, /* 28P01 invalid_password */
    {"does not exist", CES_PGERR_FATAL}, /* 3D000 invalid_catalog_name, 28000 (a role) */
    {"no pg_hba.conf entry", CES_PGERR_FATAL}, /* 28000 invalid_authorization_specification */
    {"authentication failed", CES_PGERR_FATAL}, /* 28000, 28P01 (other methods) */
    {"permission denied", CES_PGERR_FATAL},     /* 42501 insufficient_privilege (CONNECT) */
    {"invalid connection option", CES_PGERR_FATAL},
    {"missing \"=\"", CES_PGERR_FATAL},
    {"invalid sslmode", CES_PGERR_FATAL},
    {"certificate", CES_PGERR_FATAL},
};

const ces_pgerr_connect_text_t *ces_pgerr_connect_texts(size_t *n) {
    *n = COUNT(connect_texts);
    return connect_texts;
}

ces_pgerr_action_t ces_pgerr_classify_connect_failure(const char *message) {
    for (size_t i = 0; i < COUNT(connect_texts); i++) {
        if (strstr(message, connect_texts[i].text) != NULL)
            return connect_texts[i].action;
    }
    return CES_PGERR_RETRY;
}

bool ces_pgerr_is_ddl_race(const char *sqlstate) {
    return sqlstate != NULL && in_list(sqlstate, ddl_race_codes, COUNT(ddl_race_codes));
}

bool ces_pgerr_undoes_only_the_step(ces_pgerr_action_t action) {
    return action == CES_PGERR_DATA || action == CES_PGERR_RETRY_ROW_BY_ROW ||
           action == CES_PGERR_RETRY_WITH_UPSERTS;
}
