#include "format/event.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads 1..max_digits hex digits from text[*pos..len) up to a ':' or the end. */
static int parse_hex_field(const char *text, size_t len, size_t *pos, size_t max_digits,
                           uint64_t *out) {
    uint64_t v = 0;
    size_t digits = 0;
    while (*pos < len && text[*pos] != ':') {
        int h = hex_value(text[*pos]);
        if (h < 0 || ++digits > max_digits)
            return -1;
        v = (v << 4) | (uint64_t)h;
        (*pos)++;
    }
    if (digits == 0)
        return -1;
    *out = v;
    return 0;
}

int ces_lsn_parse(const char *text, size_t len, ces_lsn_t *lsn) {
    uint64_t vlf, block, slot;
    size_t pos = 0;
    if (parse_hex_field(text, len, &pos, 8, &vlf) != 0 || pos >= len || text[pos++] != ':')
        return -1;
    if (parse_hex_field(text, len, &pos, 8, &block) != 0 || pos >= len || text[pos++] != ':')
        return -1;
    if (parse_hex_field(text, len, &pos, 4, &slot) != 0 || pos != len)
        return -1;
    lsn->high = (uint32_t)vlf;
    lsn->low = (block << 16) | slot;
    return 0;
}

int ces_lsn_parse_compact(const char *text, size_t len, ces_lsn_t *lsn) {
    if (len != 20)
        return -1;
    uint64_t fields[3] = {0, 0, 0};
    static const size_t widths[3] = {8, 8, 4};
    size_t pos = 0;
    for (int f = 0; f < 3; f++) {
        for (size_t i = 0; i < widths[f]; i++) {
            int h = hex_value(text[pos++]);
            if (h < 0)
                return -1;
            fields[f] = (fields[f] << 4) | (uint64_t)h;
        }
    }
    lsn->high = (uint32_t)fields[0];
    lsn->low = (fields[1] << 16) | fields[2];
    return 0;
}

int ces_lsn_parse_operator(const char *text, ces_lsn_t *lsn) {
    size_t len = strlen(text);
    if (len == 22 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
        return ces_lsn_parse_compact(text + 2, 20, lsn);
    return ces_lsn_parse(text, len, lsn);
}

void ces_lsn_format(ces_lsn_t lsn, char buf[23]) {
    snprintf(buf, 23, "%08X:%08X:%04X", (unsigned)lsn.high, (unsigned)(lsn.low >> 16),
             (unsigned)(lsn.low & 0xFFFF));
}

int ces_version_compare(const ces_version_t *a, const ces_version_t *b) {
    int c = ces_lsn_compare(a->commit_lsn, b->commit_lsn);
    if (c != 0)
        return c;
    if (a->sequence != b->sequence)
        return a->sequence < b->sequence ? -1 : 1;
    return 0;
}

/* Writes v in decimal into out: width digits with leading zeros, or (width 0) as many as it has.
 * Returns the number of digits written. */
static size_t put_decimal(char *out, uint64_t v, size_t width) {
    char digits[20];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v != 0);
    while (n < width)
        digits[n++] = '0';
    for (size_t i = 0; i < n; i++)
        out[i] = digits[n - 1 - i];
    return n;
}

void ces_version_format(const ces_version_t *p, char *buf, size_t size) {
    /* 80 bits of LSN in decimal (at most 25 digits), then the sequence number in 20 digits with
     * leading zeros (2^64 - 1 has 20). Formatted by hand, not with snprintf: this runs for every
     * row change. The LSN is split once into 64-bit halves (below and above 10^19), so that each
     * digit costs a 64-bit division, not a 128-bit one. */
    __extension__ typedef unsigned __int128 u128;
    const uint64_t ten19 = 10000000000000000000ULL;
    u128 lsn = ((u128)p->commit_lsn.high << 48) | p->commit_lsn.low;
    uint64_t upper = (uint64_t)(lsn / ten19), lower = (uint64_t)(lsn % ten19);
    char text[25 + 20 + 1];
    size_t n = 0;
    if (upper != 0) {
        n = put_decimal(text, upper, 0);
        n += put_decimal(text + n, lower, 19);
    } else {
        n = put_decimal(text, lower, 0);
    }
    n += put_decimal(text + n, p->sequence, 20);
    if (size == 0)
        return;
    if (n >= size)
        n = size - 1;
    memcpy(buf, text, n);
    buf[n] = '\0';
}

void ces_version_ceiling(ces_lsn_t lsn, char *buf, size_t size) {
    char text[25 + 20 + 1];
    ces_version_format(&(ces_version_t){.commit_lsn = lsn, .sequence = 0}, text, sizeof(text));
    size_t n = strlen(text);
    memset(text + n - 20, '9', 20);
    snprintf(buf, size, "%s", text);
}

const char *ces_op_name(ces_op_t op) {
    switch (op) {
    case CES_OP_INSERT: return "INS";
    case CES_OP_UPDATE: return "UPD";
    case CES_OP_DELETE: return "DEL";
    }
    return "?";
}

const ces_field_t *ces_fields_find(const ces_field_t *fields, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++) {
        if (strcmp(fields[i].name, name) == 0)
            return &fields[i];
    }
    return NULL;
}

static void dump_text(FILE *out, const char *s, size_t len) {
    fputc('"', out);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", out);
        else if (ch == '\t')
            fputs("\\t", out);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(out, "\\x%02x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

static void dump_fields(FILE *out, const char *label, const ces_field_t *fields, size_t count) {
    fprintf(out, "%s: %zu\n", label, count);
    for (size_t i = 0; i < count; i++) {
        fprintf(out, "  ");
        dump_text(out, fields[i].name, fields[i].name_len);
        fputs(" = ", out);
        if (fields[i].is_null)
            fputs("NULL", out);
        else
            dump_text(out, fields[i].value, fields[i].value_len);
        fputc('\n', out);
    }
}

void ces_event_dump(const ces_event_t *ev, FILE *out) {
    char lsn[23];
    ces_lsn_format(ev->version.commit_lsn, lsn);
    fprintf(out, "op: %s\n", ces_op_name(ev->op));
    fprintf(out, "id: %s\n", ev->id ? ev->id : "(none)");
    fprintf(out, "logicalid: %s\n", ev->logicalid ? ev->logicalid : "(none)");
    fprintf(out, "time: %s\n", ev->time ? ev->time : "(none)");
    fprintf(out, "position: %s #%llu\n", lsn, (unsigned long long)ev->version.sequence);
    fprintf(out, "table: ");
    dump_text(out, ev->db, strlen(ev->db));
    fputc('.', out);
    dump_text(out, ev->schema, strlen(ev->schema));
    fputc('.', out);
    dump_text(out, ev->table, strlen(ev->table));
    fprintf(out, "\ncols: %zu\n", ev->ncols);
    for (size_t i = 0; i < ev->ncols; i++) {
        fputs("  ", out);
        dump_text(out, ev->cols[i].name, ev->cols[i].name_len);
        fputc(' ', out);
        fwrite(ev->cols[i].type, 1, ev->cols[i].type_len, out);
        fputc('\n', out);
    }
    dump_fields(out, "pkkey", ev->pkkey, ev->npkkey);
    dump_fields(out, "old", ev->old, ev->nold);
    dump_fields(out, "current", ev->current, ev->ncurrent);
}

/* The compact copy is one allocation: the arrays first (aligned for their structs), then the
 * shape's names in one run, then every other text, packed end to end, each with its NUL. Names,
 * types and values come with their lengths (a wide event has dozens of each); the envelope's few
 * texts are measured with strlen and copied with stpcpy. */
static size_t aligned(size_t n) { return (n + 15) & ~(size_t)15; }

static size_t text_bytes(const char *s) { return s == NULL ? 0 : strlen(s) + 1; }

static size_t fields_bytes(const ces_field_t *f, size_t n, size_t *names) {
    size_t values = 0;
    for (size_t i = 0; i < n; i++) {
        *names += f[i].name_len + 1;
        values += f[i].value ? f[i].value_len + 1 : 0;
    }
    return values;
}

static const char *put_text(char **w, const char *s) {
    if (s == NULL)
        return NULL;
    char *at = *w;
    *w = stpcpy(at, s) + 1;
    return at;
}

/* s[0..len) and a NUL at *w; s is not NULL. */
static const char *put_text_n(char **w, const char *s, size_t len) {
    char *at = *w;
    memcpy(at, s, len);
    at[len] = '\0';
    *w = at + len + 1;
    return at;
}

/* Names go to *names (the shape's run), values to *w. */
static ces_field_t *put_fields(char **names, char **w, ces_field_t *c, const ces_field_t *f,
                               size_t n) {
    if (n == 0)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        c[i] = f[i];
        c[i].name = put_text_n(names, f[i].name, f[i].name_len);
        if (f[i].value != NULL)
            c[i].value = put_text_n(w, f[i].value, f[i].value_len);
    }
    return c;
}

ces_arena_t *ces_event_copy_new(const ces_event_t *e, size_t extra, ces_event_t *copy) {
    size_t cols = aligned(e->ncols * sizeof(*e->cols));
    size_t pkkey = aligned(e->npkkey * sizeof(*e->pkkey));
    size_t old = aligned(e->nold * sizeof(*e->old));
    size_t current = aligned(e->ncurrent * sizeof(*e->current));
    size_t shape = 0;
    size_t text = text_bytes(e->id) + text_bytes(e->logicalid) + text_bytes(e->time) +
                  text_bytes(e->db) + text_bytes(e->schema) + text_bytes(e->table);
    for (size_t i = 0; i < e->ncols; i++)
        shape += e->cols[i].name_len + e->cols[i].type_len + 2;
    text += fields_bytes(e->pkkey, e->npkkey, &shape) +
            fields_bytes(e->current, e->ncurrent, &shape) + fields_bytes(e->old, e->nold, &shape);
    size_t arrays = cols + pkkey + old + current;
    /* Sizes are bounded by the record that was decoded: no sum here can wrap. */
    ces_arena_t *arena = ces_arena_new_whole(arrays + aligned(shape + text) + extra);
    unsigned char *block = arena ? ces_arena_alloc(arena, arrays + shape + text) : NULL;
    if (block == NULL) {
        ces_arena_destroy(arena);
        return NULL;
    }
    char *names = (char *)block + arrays, *w = names + shape;
    *copy = *e;
    copy->shape = names;
    copy->shape_len = shape;
    copy->id = put_text(&w, e->id);
    copy->logicalid = put_text(&w, e->logicalid);
    copy->time = put_text(&w, e->time);
    copy->db = put_text(&w, e->db);
    copy->schema = put_text(&w, e->schema);
    copy->table = put_text(&w, e->table);
    copy->cols = NULL;
    if (e->ncols > 0) {
        copy->cols = (ces_column_t *)block;
        for (size_t i = 0; i < e->ncols; i++) {
            copy->cols[i] = e->cols[i];
            copy->cols[i].name = put_text_n(&names, e->cols[i].name, e->cols[i].name_len);
            copy->cols[i].type = put_text_n(&names, e->cols[i].type, e->cols[i].type_len);
        }
    }
    copy->pkkey = put_fields(&names, &w, (ces_field_t *)(block + cols), e->pkkey, e->npkkey);
    copy->current = put_fields(&names, &w, (ces_field_t *)(block + cols + pkkey + old),
                               e->current, e->ncurrent);
    copy->old = put_fields(&names, &w, (ces_field_t *)(block + cols + pkkey), e->old, e->nold);
    return arena;
}

int ces_event_parse_time(const char *text, double *seconds) {
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int n = 0;
    if (text == NULL || sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon,
                               &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n != 19)
        return -1;
    if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59 || tm.tm_sec > 60)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *p = text + n;
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        for (; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    long offset = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int hh, mm, k = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &k) != 2 || k != 5)
            return -1;
        offset = (*p == '+' ? 1 : -1) * (hh * 3600L + mm * 60L);
        p += 6;
    }
    /* No zone at all: CES writes UTC. */
    if (*p != '\0')
        return -1;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -1;
    *seconds = (double)t - (double)offset + frac;
    return 0;
}
