#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A strict RFC 8259 parser written for this one job: one pass over the text, strings unescaped
 * straight into the arena, plain ASCII scanned eight bytes at a time. (ces2pg used yajl's callback
 * parser before; parsing every record three levels deep made yajl the bottleneck of decoding. The
 * fuzz harness still checks that this parser never accepts what yajl rejects.)
 *
 * Accepted: one value with optional blanks (space, tab, CR, LF) around it; strings of UTF-8 in
 * its shortest form, without raw control characters, with the escapes \" \\ \/ \b \f \n \r \t and
 * \uXXXX (surrogates only as pairs; \u0000 gives a NUL, kept because strings carry their length);
 * numbers of the JSON grammar up to CES_JSON_MAX_NUMBER characters; true, false, null.
 */

/* One open container: its children collect in a scratch vector that is copied into the arena when
 * the container closes (sizes are unknown until then). */
typedef struct {
    ces_json_type_t type;
    ces_json_member_t *members; /* scratch; reused across parses */
    size_t count;
    size_t capacity;
    const char *key; /* OBJECT: key of the value being parsed */
    size_t key_len;
} frame_t;

struct ces_json_parser_s {
    frame_t *frames;
    size_t frame_capacity;
    char *scratch; /* strings with escapes are unescaped here, then copied to the arena */
    size_t scratch_capacity;
    /* the parse in progress */
    const unsigned char *start, *p, *end;
    ces_arena_t *arena;
    const ces_json_limits_t *limits;
    char error[200];
};

ces_json_parser_t *ces_json_parser_new(void) { return calloc(1, sizeof(ces_json_parser_t)); }

void ces_json_parser_destroy(ces_json_parser_t *parser) {
    if (parser == NULL)
        return;
    for (size_t i = 0; i < parser->frame_capacity; i++)
        free(parser->frames[i].members);
    free(parser->frames);
    free(parser->scratch);
    free(parser);
}

/* Records the first error; returns -1 so callers can "return fail(...)". */
static int fail(ces_json_parser_t *p, const char *msg) {
    if (p->error[0] == '\0')
        snprintf(p->error, sizeof(p->error), "%s", msg);
    return -1;
}

static int malformed(ces_json_parser_t *p, const char *what) {
    if (p->error[0] == '\0') {
        if (p->p >= p->end)
            snprintf(p->error, sizeof(p->error), "malformed JSON: %s: premature end of input", what);
        else
            snprintf(p->error, sizeof(p->error), "malformed JSON: %s at byte %zu", what,
                     (size_t)(p->p - p->start));
    }
    return -1;
}

/* Length of the UTF-8 sequence at s (1..4), or 0 when it is not valid UTF-8 in its shortest form,
 * is a surrogate, or goes past U+10FFFF or past avail bytes. */
static inline size_t utf8_sequence(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) /* two bytes: no overlong or surrogate form is possible */
        return avail >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (avail - 1 < n)
        return 0;
    for (size_t k = 1; k <= n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n + 1;
}

#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)

/* The bytes of w (byte 0 lowest) that need a closer look inside a string: '"', '\\', control
 * characters, and non-ASCII bytes when non_ascii is HIGHS. Only the lowest set bit is exact (borrows
 * may flag bytes above it), and it marks the first such byte: that is all the scan uses. */
static inline uint64_t special_bytes(uint64_t w, uint64_t non_ascii) {
    uint64_t quote = w ^ (ONES * '"'), backslash = w ^ (ONES * '\\');
    uint64_t has_quote = (quote - ONES) & ~quote;
    uint64_t has_backslash = (backslash - ONES) & ~backslash;
    uint64_t has_control = (w - ONES * 0x20) & ~w;
    return (has_quote | has_backslash | has_control | (w & non_ascii)) & HIGHS;
}

/* Eight bytes at s as a little-endian word (byte 0 lowest). */
static inline uint64_t load_le64(const unsigned char *s) {
    uint64_t w;
    memcpy(&w, s, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static int hex4(const unsigned char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Appends code point cp (at most U+10FFFF, not a surrogate) as UTF-8 at dst; returns its length. */
static size_t put_utf8(uint32_t cp, char *dst) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the escape at q (a backslash) into dst; advances *qp past it and returns the bytes
 * written, or 0 after recording the error. Every escape takes at least as many bytes as it writes. */
static size_t escape(ces_json_parser_t *p, const unsigned char **qp, char *dst) {
    const unsigned char *q = *qp, *end = p->end;
    if (end - q < 2) {
        p->p = end;
        malformed(p, "unterminated string");
        return 0;
    }
    *qp = q + 2;
    switch (q[1]) {
    case '"': case '\\': case '/': dst[0] = (char)q[1]; return 1;
    case 'b': dst[0] = '\b'; return 1;
    case 'f': dst[0] = '\f'; return 1;
    case 'n': dst[0] = '\n'; return 1;
    case 'r': dst[0] = '\r'; return 1;
    case 't': dst[0] = '\t'; return 1;
    case 'u': break;
    default:
        fail(p, "malformed JSON: invalid escape in a string");
        return 0;
    }
    uint32_t cp, low;
    if (end - q < 6 || hex4(q + 2, &cp) != 0) {
        fail(p, "malformed JSON: invalid \\u escape in a string");
        return 0;
    }
    q += 6;
    if (cp >= 0xDC00 && cp <= 0xDFFF) {
        fail(p, "malformed JSON: unpaired UTF-16 surrogate escape in a string");
        return 0;
    }
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end - q < 6 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &low) != 0 || low < 0xDC00 ||
            low > 0xDFFF) {
            fail(p, "malformed JSON: unpaired UTF-16 surrogate escape in a string");
            return 0;
        }
        q += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    *qp = q;
    return put_utf8(cp, dst);
}

/* Reads the string at p->p (its opening quote) into a NUL-terminated arena copy. A string without
 * escapes is scanned, then copied once; from the first escape on, the rest is unescaped into the
 * parser's scratch buffer in the same pass, then copied. Plain ASCII goes eight bytes at a time. */
static int read_string(ces_json_parser_t *p, const char **out, size_t *out_len) {
    const unsigned char *s = ++p->p, *q = s, *end = p->end;
    /* Text known to be valid UTF-8 needs no second check of its non-ASCII bytes. */
    uint64_t non_ascii = p->limits->valid_utf8 ? 0 : HIGHS;
    char *dst = NULL;
    size_t o = 0;
    for (;;) {
        while (end - q >= 8) {
            uint64_t m = special_bytes(load_le64(q), non_ascii);
            if (m != 0) {
                q += (unsigned)__builtin_ctzll(m) / 8;
                break;
            }
            q += 8;
        }
        if (q >= end) {
            p->p = q;
            return malformed(p, "unterminated string");
        }
        unsigned char c = *q;
        if (c == '"')
            break;
        if (c == '\\')
            goto escaped;
        if (c < 0x20) {
            p->p = q;
            return malformed(p, "control character in a string");
        }
        if (c < 0x80 || non_ascii == 0) {
            q++;
        } else {
            size_t n = utf8_sequence(q, (size_t)(end - q));
            if (n == 0)
                return fail(p, "invalid UTF-8 in a JSON string");
            q += n;
        }
    }
    /* No escapes: one copy. */
    o = (size_t)(q - s);
    p->p = q + 1;
    dst = ces_arena_alloc(p->arena, o + 1);
    if (dst == NULL)
        return fail(p, "out of memory");
    memcpy(dst, s, o);
    dst[o] = '\0';
    *out = dst;
    *out_len = o;
    return 0;

escaped:
    /* The result is at most end - s bytes; o <= q - s all along, so a whole word always fits. */
    if (p->scratch_capacity < (size_t)(end - s) + 8) {
        size_t cap = (size_t)(end - s) + 8;
        if (cap < p->scratch_capacity * 2)
            cap = p->scratch_capacity * 2;
        char *b = realloc(p->scratch, cap);
        if (b == NULL)
            return fail(p, "out of memory");
        p->scratch = b;
        p->scratch_capacity = cap;
    }
    dst = p->scratch;
    o = (size_t)(q - s);
    memcpy(dst, s, o);
    for (;;) {
        while (end - q >= 8) {
            uint64_t w = load_le64(q), m = special_bytes(w, non_ascii);
            memcpy(dst + o, q, 8);
            if (m != 0) {
                size_t k = (unsigned)__builtin_ctzll(m) / 8;
                q += k;
                o += k;
                break;
            }
            q += 8;
            o += 8;
        }
        if (q >= end) {
            p->p = q;
            return malformed(p, "unterminated string");
        }
        unsigned char c = *q;
        if (c == '"')
            break;
        if (c == '\\') {
            size_t n = escape(p, &q, dst + o);
            if (n == 0)
                return -1;
            o += n;
        } else if (c < 0x20) {
            p->p = q;
            return malformed(p, "control character in a string");
        } else if (c < 0x80 || non_ascii == 0) {
            dst[o++] = (char)c;
            q++;
        } else {
            size_t n = utf8_sequence(q, (size_t)(end - q));
            if (n == 0)
                return fail(p, "invalid UTF-8 in a JSON string");
            memcpy(dst + o, q, n);
            o += n;
            q += n;
        }
    }
    p->p = q + 1;
    char *copy = ces_arena_alloc(p->arena, o + 1);
    if (copy == NULL)
        return fail(p, "out of memory");
    memcpy(copy, dst, o);
    copy[o] = '\0';
    *out = copy;
    *out_len = o;
    return 0;
}

static int read_number(ces_json_parser_t *p, ces_json_t *v) {
    const unsigned char *s = p->p, *q = s, *end = p->end;
    if (q < end && *q == '-')
        q++;
    if (q < end && *q == '0') {
        q++;
    } else if (q < end && *q >= '1' && *q <= '9') {
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    } else {
        p->p = q;
        return malformed(p, "invalid number");
    }
    if (q < end && *q == '.') {
        q++;
        if (q >= end || *q < '0' || *q > '9') {
            p->p = q;
            return malformed(p, "invalid number");
        }
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        if (q >= end || *q < '0' || *q > '9') {
            p->p = q;
            return malformed(p, "invalid number");
        }
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    }
    size_t len = (size_t)(q - s);
    if (len > CES_JSON_MAX_NUMBER)
        return fail(p, "JSON number longer than 100 characters");
    p->p = q;
    v->type = CES_JSON_NUMBER;
    v->text = ces_arena_strndup(p->arena, (const char *)s, len);
    if (v->text == NULL)
        return fail(p, "out of memory");
    v->text_len = len;
    return 0;
}

static inline void skip_blanks(ces_json_parser_t *p) {
    const unsigned char *q = p->p, *end = p->end;
    while (q < end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t'))
        q++;
    p->p = q;
}

static int open_frame(ces_json_parser_t *p, size_t depth, ces_json_type_t type) {
    if (depth >= p->limits->max_depth)
        return fail(p, "JSON nested too deeply");
    if (depth == p->frame_capacity) {
        size_t cap = p->frame_capacity ? p->frame_capacity * 2 : 8;
        frame_t *frames = realloc(p->frames, cap * sizeof(*frames));
        if (frames == NULL)
            return fail(p, "out of memory");
        memset(frames + p->frame_capacity, 0, (cap - p->frame_capacity) * sizeof(*frames));
        p->frames = frames;
        p->frame_capacity = cap;
    }
    frame_t *f = &p->frames[depth];
    f->type = type;
    f->count = 0;
    f->key = NULL;
    f->key_len = 0;
    return 0;
}

static int add_member(ces_json_parser_t *p, frame_t *f, const ces_json_t *value) {
    if (f->count >= p->limits->max_container)
        return fail(p, "too many members in one JSON object or array");
    if (f->count == f->capacity) {
        size_t cap = f->capacity ? f->capacity * 2 : 16;
        ces_json_member_t *m = realloc(f->members, cap * sizeof(*m));
        if (m == NULL)
            return fail(p, "out of memory");
        f->members = m;
        f->capacity = cap;
    }
    ces_json_member_t *m = &f->members[f->count++];
    m->key = f->key;
    m->key_len = f->key_len;
    m->value = *value;
    return 0;
}

static int close_frame(ces_json_parser_t *p, frame_t *f, ces_json_t *v) {
    memset(v, 0, sizeof(*v));
    v->type = f->type;
    v->count = f->count;
    if (f->count == 0)
        return 0;
    if (f->type == CES_JSON_OBJECT) {
        v->members = ces_arena_alloc(p->arena, f->count * sizeof(ces_json_member_t));
        if (v->members == NULL)
            return fail(p, "out of memory");
        memcpy(v->members, f->members, f->count * sizeof(ces_json_member_t));
    } else {
        v->items = ces_arena_alloc(p->arena, f->count * sizeof(ces_json_t));
        if (v->items == NULL)
            return fail(p, "out of memory");
        for (size_t i = 0; i < f->count; i++)
            v->items[i] = f->members[i].value;
    }
    return 0;
}

/* Reads `"key" :` of an object member into the frame. */
static int read_key(ces_json_parser_t *p, frame_t *f) {
    if (p->p >= p->end || *p->p != '"')
        return malformed(p, "expected a string as object key");
    if (read_string(p, &f->key, &f->key_len) != 0)
        return -1;
    skip_blanks(p);
    if (p->p >= p->end || *p->p != ':')
        return malformed(p, "expected ':' after an object key");
    p->p++;
    skip_blanks(p);
    return 0;
}

static int parse_text(ces_json_parser_t *p, ces_json_t *root) {
    size_t depth = 0;
    ces_json_t v;
    skip_blanks(p);
    if (p->p >= p->end)
        return fail(p, "malformed JSON: empty input");
    for (;;) {
        /* A value starts at p->p. */
        if (p->p >= p->end)
            return malformed(p, "expected a value");
        memset(&v, 0, sizeof(v));
        unsigned char c = *p->p;
        switch (c) {
        case '{':
        case '[': {
            ces_json_type_t type = c == '{' ? CES_JSON_OBJECT : CES_JSON_ARRAY;
            if (open_frame(p, depth, type) != 0)
                return -1;
            frame_t *f = &p->frames[depth++];
            p->p++;
            skip_blanks(p);
            if (p->p < p->end && *p->p == (c == '{' ? '}' : ']')) {
                p->p++;
                depth--;
                if (close_frame(p, f, &v) != 0)
                    return -1;
                break;
            }
            if (type == CES_JSON_OBJECT && read_key(p, f) != 0)
                return -1;
            continue;
        }
        case '"':
            v.type = CES_JSON_STRING;
            if (read_string(p, &v.text, &v.text_len) != 0)
                return -1;
            break;
        case 't':
        case 'f':
        case 'n': {
            const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
            size_t n = strlen(word);
            if ((size_t)(p->end - p->p) < n || memcmp(p->p, word, n) != 0)
                return malformed(p, "invalid literal");
            p->p += n;
            v.type = c == 'n' ? CES_JSON_NULL : CES_JSON_BOOL;
            v.boolean = c == 't';
            break;
        }
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                if (read_number(p, &v) != 0)
                    return -1;
                break;
            }
            return malformed(p, "unexpected character");
        }
        /* v is complete: attach it, closing containers as their ends come. */
        for (;;) {
            if (depth == 0) {
                skip_blanks(p);
                if (p->p < p->end)
                    return malformed(p, "trailing garbage after the value");
                *root = v;
                return 0;
            }
            frame_t *f = &p->frames[depth - 1];
            if (add_member(p, f, &v) != 0)
                return -1;
            skip_blanks(p);
            if (p->p >= p->end)
                return malformed(p, "unterminated object or array");
            char close = f->type == CES_JSON_OBJECT ? '}' : ']';
            if (*p->p == ',') {
                p->p++;
                skip_blanks(p);
                if (f->type == CES_JSON_OBJECT && read_key(p, f) != 0)
                    return -1;
                break; /* the next value */
            }
            if (*p->p != close)
                return malformed(p, f->type == CES_JSON_OBJECT ? "expected ',' or '}'"
                                                                : "expected ',' or ']'");
            p->p++;
            depth--;
            if (close_frame(p, f, &v) != 0)
                return -1;
        }
    }
}

const ces_json_t *ces_json_parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                                 size_t len, const ces_json_limits_t *limits, char *errstr,
                                 size_t errstr_size) {
    parser->start = parser->p = (const unsigned char *)text;
    parser->end = parser->start + len;
    parser->arena = arena;
    parser->limits = limits;
    parser->error[0] = '\0';
    ces_json_t value;
    int rc = parse_text(parser, &value);
    if (parser->scratch_capacity > (1u << 20)) { /* keep a big event's buffer no longer */
        free(parser->scratch);
        parser->scratch = NULL;
        parser->scratch_capacity = 0;
    }
    if (rc != 0) {
        snprintf(errstr, errstr_size, "%s", parser->error);
        return NULL;
    }
    ces_json_t *root = ces_arena_alloc(arena, sizeof(*root));
    if (root == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    *root = value;
    return root;
}

const ces_json_t *ces_json_get(const ces_json_t *object, const char *key) {
    if (object == NULL || object->type != CES_JSON_OBJECT)
        return NULL;
    size_t key_len = strlen(key);
    for (size_t i = 0; i < object->count; i++) {
        const ces_json_member_t *m = &object->members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0)
            return &m->value;
    }
    return NULL;
}

bool ces_utf8_valid(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        /* ASCII, the common case, eight bytes at a time. */
        while (len - i >= 8) {
            if (load_le64(s + i) & HIGHS)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        size_t n = utf8_sequence(s + i, len - i);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

const char *ces_json_type_name(ces_json_type_t type) {
    switch (type) {
    case CES_JSON_NULL: return "null";
    case CES_JSON_BOOL: return "boolean";
    case CES_JSON_NUMBER: return "number";
    case CES_JSON_STRING: return "string";
    case CES_JSON_ARRAY: return "array";
    case CES_JSON_OBJECT: return "object";
    }
    return "unknown";
}
