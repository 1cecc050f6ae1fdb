/*
 * libFuzzer harness over the record decoder: one input is one Kafka record value, decoded the way
 * the pipeline does it (envelope, then the event from the record's own data), in both encodings
 * (JSON, Avro bare datum, Avro object container file; kafka.format "auto" tells them apart).
 *
 * Findings are crashes, sanitizer reports, leaks (LeakSanitizer, including avro-c allocations the
 * guard failed to sweep), and contract breaches turned into aborts: a rejection without a reason,
 * "out of memory" for a record (which would stop the daemon instead of dead-lettering it), and JSON
 * that ces2pg's reader accepts while yajl rejects it or reads other values from it (the input is
 * also parsed as plain JSON by both, with generous limits: ces2pg's reader must be the stricter).
 *
 * Built by -DCES2PG_FUZZ=ON with clang; tests/fuzz/run runs it (scripts/test: 60 s).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "format/decode.h"
#include "format/json.h"

static ces_decoder_t *decoder;
static ces_json_parser_t *json;
static FILE *sink;

/* A flat rendering of a JSON value, the same for ces2pg's tree and for yajl's callbacks. */
static void flatten(const ces_json_t *v, FILE *out) {
    switch (v->type) {
    case CES_JSON_NULL: fputs("n ", out); break;
    case CES_JSON_BOOL: fputs(v->boolean ? "t " : "f ", out); break;
    case CES_JSON_NUMBER: fprintf(out, "N%zu:%s ", v->text_len, v->text); break;
    case CES_JSON_STRING:
        fprintf(out, "S%zu:", v->text_len);
        fwrite(v->text, 1, v->text_len, out);
        break;
    case CES_JSON_ARRAY:
        fputs("[", out);
        for (size_t i = 0; i < v->count; i++)
            flatten(&v->items[i], out);
        fputs("]", out);
        break;
    case CES_JSON_OBJECT:
        fputs("{", out);
        for (size_t i = 0; i < v->count; i++) {
            fprintf(out, "K%zu:", v->members[i].key_len);
            fwrite(v->members[i].key, 1, v->members[i].key_len, out);
            flatten(&v->members[i].value, out);
        }
        fputs("}", out);
        break;
    }
}

static int y_null(void *c) { fputs("n ", c); return 1; }
static int y_bool(void *c, int b) { fputs(b ? "t " : "f ", c); return 1; }
static int y_num(void *c, const char *s, size_t l) {
    fprintf(c, "N%zu:%.*s ", l, (int)l, s);
    return 1;
}
static int y_str(void *c, const unsigned char *s, size_t l) {
    fprintf(c, "S%zu:", l);
    fwrite(s, 1, l, c);
    return 1;
}
static int y_key(void *c, const unsigned char *s, size_t l) {
    fprintf(c, "K%zu:", l);
    fwrite(s, 1, l, c);
    return 1;
}
static int y_sm(void *c) { fputs("{", c); return 1; }
static int y_em(void *c) { fputs("}", c); return 1; }
static int y_sa(void *c) { fputs("[", c); return 1; }
static int y_ea(void *c) { fputs("]", c); return 1; }
static const yajl_callbacks ycb = {y_null, y_bool, NULL, NULL, y_num, y_str,
                                   y_sm,   y_key,  y_em, y_sa, y_ea};

/* Whatever ces2pg's JSON reader accepts, yajl accepts with the same values. */
static void differential_json(const uint8_t *data, size_t size) {
    static const ces_json_limits_t limits = {.max_depth = 64, .max_container = 100000};
    ces_arena_t *arena = ces_arena_new();
    char err[256];
    const ces_json_t *v = ces_json_parse(json, arena, (const char *)data, size, &limits, err,
                                         sizeof(err));
    if (v != NULL) {
        char *ours = NULL, *theirs = NULL;
        size_t ours_len = 0, theirs_len = 0;
        FILE *out = open_memstream(&ours, &ours_len);
        flatten(v, out);
        fclose(out);
        out = open_memstream(&theirs, &theirs_len);
        yajl_handle h = yajl_alloc(&ycb, NULL, out);
        yajl_status st = yajl_parse(h, data, size);
        if (st == yajl_status_ok)
            st = yajl_complete_parse(h);
        yajl_free(h);
        fclose(out);
        if (st != yajl_status_ok) {
            fprintf(stderr, "ces2pg's JSON reader accepted what yajl rejects\n");
            abort();
        }
        if (ours_len != theirs_len || memcmp(ours, theirs, ours_len) != 0) {
            fprintf(stderr, "ces2pg's JSON reader and yajl read different values\n");
            abort();
        }
        /* Parsed in place, the same text gives the same tree. */
        char *copy = malloc(size + 1);
        if (copy == NULL)
            abort();
        memcpy(copy, data, size);
        const ces_json_t *w =
            ces_json_parse_in_place(json, arena, copy, size, &limits, err, sizeof(err));
        char *in_place = NULL;
        size_t in_place_len = 0;
        out = open_memstream(&in_place, &in_place_len);
        if (w != NULL)
            flatten(w, out);
        fclose(out);
        if (w == NULL || in_place_len != ours_len || memcmp(in_place, ours, ours_len) != 0) {
            fprintf(stderr, "ces2pg's JSON reader read different values in place\n");
            abort();
        }
        free(in_place);
        free(copy);
        free(ours);
        free(theirs);
    } else if (err[0] == '\0') {
        abort();
    }
    ces_arena_destroy(arena);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    /* Smaller than the defaults, so that inputs of a few KB reach every bound. */
    limits.max_record_bytes = 1u << 20;
    limits.max_event_bytes = 1u << 20;
    limits.max_columns = 64;
    limits.max_value_bytes = 4096;
    decoder = ces_decoder_new(&limits);
    json = ces_json_parser_new();
    sink = fopen("/dev/null", "w");
    if (decoder == NULL || json == NULL || sink == NULL)
        abort();
    return 0;
}

static void check(ces_decode_status_t st, const char *reason) {
    if (st == CES_DECODE_NOMEM) {
        fprintf(stderr, "decoder reported out of memory for a record\n");
        abort();
    }
    if (st == CES_DECODE_REJECTED && reason[0] == '\0') {
        fprintf(stderr, "rejection without a reason\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ces_arena_t *arena = ces_arena_new();
    if (arena == NULL)
        abort();
    char reason[512] = "";
    ces_envelope_t env;
    ces_decode_status_t st =
        ces_decode_envelope(decoder, arena, data, size, &env, reason, sizeof(reason));
    check(st, reason);
    if (st == CES_DECODE_OK) {
        ces_event_t ev;
        reason[0] = '\0';
        st = ces_decode_event(decoder, arena, &env, env.data, env.data_len, &ev, reason,
                              sizeof(reason));
        check(st, reason);
        char *dump = NULL, *in_place = NULL;
        size_t dump_len = 0, in_place_len = 0;
        FILE *out = open_memstream(&dump, &dump_len);
        if (st == CES_DECODE_OK)
            ces_event_dump(&ev, out); /* touches every string of the event */
        else
            fprintf(out, "%d %s", (int)st, reason);
        fclose(out);
        /* Decoded in place (as the pipeline does), the same data gives the same event. */
        reason[0] = '\0';
        st = ces_decode_event_in_place(decoder, arena, &env, (char *)env.data, env.data_len, &ev,
                                       reason, sizeof(reason));
        check(st, reason);
        out = open_memstream(&in_place, &in_place_len);
        if (st == CES_DECODE_OK)
            ces_event_dump(&ev, out);
        else
            fprintf(out, "%d %s", (int)st, reason);
        fclose(out);
        if (in_place_len != dump_len || memcmp(in_place, dump, dump_len) != 0) {
            fprintf(stderr, "the event decoded in place differs\n");
            abort();
        }
        fwrite(dump, 1, dump_len, sink);
        free(dump);
        free(in_place);
    }
    ces_arena_destroy(arena);
    differential_json(data, size);
    return 0;
}
