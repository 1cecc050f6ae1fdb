/*
 * bench/pg-ceiling: the PostgreSQL ceiling of bench/run. Writes the row operations of a generated
 * stream (tools/ces-gen --ops-out) into existing tables with the best simple libpq strategy, and
 * nothing else (no decoding, no version guard, no positions).
 *
 *   build/bench-pg-ceiling CONNINFO copy FILE          every line an insert (I): one COPY ... FROM
 *                                                     STDIN per run of lines of the same table
 *                                                     (bench/run sorts the file by table)
 *   build/bench-pg-ceiling CONNINFO upsert FILE [N]    I/U: prepared INSERT ... ON CONFLICT (key)
 *                                                     DO UPDATE SET every other column; D: prepared
 *                                                     DELETE ... WHERE key; pipeline mode, N (1000)
 *                                                     operations per transaction, the next
 *                                                     transaction sent while the previous one runs
 *
 * Values are passed as text, as ces2pg passes them, and PostgreSQL's input functions convert
 * them. Prints one JSON line: {"ops": N, "seconds": S, "backend_pid": PID} (S from connecting to
 * the last commit; PID the server process, whose CPU time bench/run counts).
 * Exits 1 on any error.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TABLES 64
#define MAX_COLS 1024

struct table {
    char *name; /* schema.table as in the file */
    char *ident; /* "schema"."table" */
    int ncols, nkeys;
    char *cols[MAX_COLS];
    char *keys[MAX_COLS];
};

static struct table tables[MAX_TABLES];
static int ntables;
static PGconn *conn;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "pg-ceiling: %s: %s\n", what, detail ? detail : "");
    exit(1);
}

/* Appends to a growing string. */
struct buf {
    char *s;
    size_t len, cap;
};

static void put(struct buf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (b->s == NULL)
            die("out of memory", NULL);
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static void put_ident(struct buf *b, const char *name) {
    char *q = PQescapeIdentifier(conn, name, strlen(name));
    if (q == NULL)
        die("escape", PQerrorMessage(conn));
    put(b, q);
    PQfreemem(q);
}

/* Splits s at sep in place; returns the number of fields. */
static int split(char *s, char sep, char **out, int max) {
    int n = 0;
    for (;;) {
        if (n == max)
            die("too many fields", NULL);
        out[n++] = s;
        char *p = strchr(s, sep);
        if (p == NULL)
            return n;
        *p = '\0';
        s = p + 1;
    }
}

static void add_table(char *line) {
    char *f[4];
    if (ntables == MAX_TABLES || split(line, '\t', f, 4) != 4)
        die("bad table line", line);
    struct table *t = &tables[ntables++];
    t->name = strdup(f[1]);
    struct buf id = {0};
    char *dot = strchr(f[1], '.');
    if (dot == NULL)
        die("table without schema", f[1]);
    *dot = '\0';
    put_ident(&id, f[1]);
    put(&id, ".");
    put_ident(&id, dot + 1);
    t->ident = id.s;
    char *cols = strdup(f[2]), *keys = strdup(f[3]);
    t->ncols = split(cols, ',', t->cols, MAX_COLS);
    t->nkeys = split(keys, ',', t->keys, MAX_COLS);
}

static struct table *find_table(const char *name) {
    for (int i = 0; i < ntables; i++)
        if (strcmp(tables[i].name, name) == 0)
            return &tables[i];
    die("unknown table", name);
    return NULL;
}

static void prepare(const char *name, const char *sql, int nparams) {
    PGresult *r = PQprepare(conn, name, sql, nparams, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die(sql, PQerrorMessage(conn));
    PQclear(r);
}

static void prepare_statements(void) {
    for (int i = 0; i < ntables; i++) {
        struct table *t = &tables[i];
        struct buf q = {0};
        char num[32];
        put(&q, "INSERT INTO ");
        put(&q, t->ident);
        put(&q, " (");
        for (int c = 0; c < t->ncols; c++) {
            if (c)
                put(&q, ", ");
            put_ident(&q, t->cols[c]);
        }
        put(&q, ") VALUES (");
        for (int c = 0; c < t->ncols; c++) {
            snprintf(num, sizeof(num), "%s$%d", c ? ", " : "", c + 1);
            put(&q, num);
        }
        put(&q, ") ON CONFLICT (");
        for (int k = 0; k < t->nkeys; k++) {
            if (k)
                put(&q, ", ");
            put_ident(&q, t->keys[k]);
        }
        put(&q, ") DO UPDATE SET ");
        int first = 1;
        for (int c = 0; c < t->ncols; c++) {
            int is_key = 0;
            for (int k = 0; k < t->nkeys; k++)
                is_key |= strcmp(t->cols[c], t->keys[k]) == 0;
            if (is_key)
                continue;
            if (!first)
                put(&q, ", ");
            first = 0;
            put_ident(&q, t->cols[c]);
            put(&q, " = EXCLUDED.");
            put_ident(&q, t->cols[c]);
        }
        snprintf(num, sizeof(num), "u%d", i);
        prepare(num, q.s, t->ncols);
        q.len = 0;
        put(&q, "DELETE FROM ");
        put(&q, t->ident);
        put(&q, " WHERE ");
        for (int k = 0; k < t->nkeys; k++) {
            if (k)
                put(&q, " AND ");
            put_ident(&q, t->keys[k]);
            snprintf(num, sizeof(num), " = $%d", k + 1);
            put(&q, num);
        }
        snprintf(num, sizeof(num), "d%d", i);
        prepare(num, q.s, t->nkeys);
        free(q.s);
    }
}

/* COPY text format field -> value in place; NULL for \N. */
static char *unescape(char *s) {
    if (s[0] == '\\' && s[1] == 'N' && s[2] == '\0')
        return NULL;
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r != '\\' || r[1] == '\0') {
            *w++ = *r;
            continue;
        }
        r++;
        switch (*r) {
        case 't': *w++ = '\t'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'v': *w++ = '\v'; break;
        default: *w++ = *r; break;
        }
    }
    *w = '\0';
    return s;
}

static void send_simple(const char *sql) {
    if (!PQsendQueryParams(conn, sql, 0, NULL, NULL, NULL, NULL, 0))
        die(sql, PQerrorMessage(conn));
}

/* Reads the results of one transaction (up to its sync). */
static void drain_one(void) {
    for (;;) {
        PGresult *r = PQgetResult(conn);
        if (r == NULL)
            continue; /* end of one query's results */
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            return;
        }
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            die("pipeline", PQresultErrorMessage(r));
        PQclear(r);
    }
}

static long run_upsert(FILE *f, char *line, size_t cap, long per_txn) {
    if (!PQenterPipelineMode(conn))
        die("pipeline mode", PQerrorMessage(conn));
    long ops = 0, in_txn = 0;
    int in_flight = 0;
    char *fields[MAX_COLS + 2];
    const char *params[MAX_COLS];
    ssize_t len;
    do {
        len = line[0] ? (ssize_t)strlen(line) : 0;
        if (len == 0)
            continue;
        if (line[len - 1] == '\n')
            line[--len] = '\0';
        int n = split(line, '\t', fields, MAX_COLS + 2);
        struct table *t = find_table(fields[1]);
        int want = fields[0][0] == 'D' ? t->nkeys : t->ncols;
        if (n - 2 != want)
            die("wrong number of values for", t->name);
        for (int i = 0; i < want; i++)
            params[i] = unescape(fields[i + 2]);
        char stmt[32];
        snprintf(stmt, sizeof(stmt), "%c%d", fields[0][0] == 'D' ? 'd' : 'u', (int)(t - tables));
        if (in_txn == 0)
            send_simple("BEGIN");
        if (!PQsendQueryPrepared(conn, stmt, want, params, NULL, NULL, 0))
            die("send", PQerrorMessage(conn));
        ops++;
        if (++in_txn == per_txn) {
            send_simple("COMMIT");
            PQpipelineSync(conn);
            in_txn = 0;
            if (in_flight)
                drain_one();
            in_flight = 1;
        }
    } while (getline(&line, &cap, f) > 0);
    if (in_txn) {
        send_simple("COMMIT");
        PQpipelineSync(conn);
        if (in_flight)
            drain_one();
        in_flight = 1;
    }
    if (in_flight)
        drain_one();
    free(line);
    return ops;
}

static void end_copy(void) {
    if (PQputCopyEnd(conn, NULL) != 1)
        die("COPY end", PQerrorMessage(conn));
    PGresult *r;
    while ((r = PQgetResult(conn)) != NULL) {
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            die("COPY", PQresultErrorMessage(r));
        PQclear(r);
    }
}

static long run_copy(FILE *f, char *line, size_t cap) {
    long ops = 0;
    struct table *cur = NULL;
    ssize_t len;
    do {
        len = line[0] ? (ssize_t)strlen(line) : 0;
        if (len == 0)
            continue;
        if (line[0] != 'I')
            die("copy mode takes inserts only, got", line);
        char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
        if (tab2 == NULL)
            die("bad line", line);
        *tab2 = '\0';
        struct table *t = find_table(tab1 + 1);
        if (t != cur) {
            if (cur)
                end_copy();
            struct buf q = {0};
            put(&q, "COPY ");
            put(&q, t->ident);
            put(&q, " (");
            for (int c = 0; c < t->ncols; c++) {
                if (c)
                    put(&q, ", ");
                put_ident(&q, t->cols[c]);
            }
            put(&q, ") FROM STDIN");
            PGresult *r = PQexec(conn, q.s);
            if (PQresultStatus(r) != PGRES_COPY_IN)
                die(q.s, PQerrorMessage(conn));
            PQclear(r);
            free(q.s);
            cur = t;
        }
        char *row = tab2 + 1;
        size_t rlen = (size_t)(line + len - row);
        if (rlen == 0 || row[rlen - 1] != '\n')
            row[rlen++] = '\n'; /* getline leaves room: the NUL */
        if (PQputCopyData(conn, row, (int)rlen) != 1)
            die("COPY data", PQerrorMessage(conn));
        ops++;
    } while ((len = getline(&line, &cap, f)) > 0);
    if (cur)
        end_copy();
    free(line);
    return ops;
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[2], "copy") != 0 && strcmp(argv[2], "upsert") != 0)) {
        fprintf(stderr, "usage: %s CONNINFO copy|upsert FILE [OPS_PER_TXN]\n", argv[0]);
        return 64;
    }
    long per_txn = argc > 4 ? atol(argv[4]) : 1000;
    if (per_txn < 1)
        per_txn = 1000;
    FILE *f = fopen(argv[3], "r");
    if (f == NULL)
        die(argv[3], "cannot open");
    double start = now_s();
    conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK)
        die("connect", PQerrorMessage(conn));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0 && line[0] == 'T') {
        if (line[len - 1] == '\n')
            line[len - 1] = '\0';
        add_table(line);
    }
    if (len <= 0)
        line[0] = '\0';
    long ops;
    if (strcmp(argv[2], "copy") == 0) {
        ops = run_copy(f, line, cap);
    } else {
        prepare_statements();
        ops = run_upsert(f, line, cap, per_txn);
    }
    double seconds = now_s() - start;
    printf("{\"ops\": %ld, \"seconds\": %.3f, \"backend_pid\": %d}\n", ops, seconds,
           PQbackendPID(conn));
    fclose(f);
    PQfinish(conn);
    return 0;
}
