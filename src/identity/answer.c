#include "identity/answer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <yajl/yajl_tree.h>

#include "util/log.h"

/* Epoch seconds ces2pg believes: after 2001, before the year 5000. A value outside is a
 * misread (milliseconds, a duration), not a date. */
#define EPOCH_MIN 1000000000LL
#define EPOCH_MAX 95000000000LL
/* The longest lifetime an expires_in may claim: a managed identity token lives 24 h at most. */
#define LIFETIME_MAX_S (7LL * 24 * 3600)

/* True when text[0..len) nests arrays and objects at most CES_ANSWER_MAX_DEPTH deep and holds no
 * NUL: checked before yajl builds a tree (yajl_tree_free recurses) and before the text is handed
 * to yajl as a C string. */
static bool json_shallow(const char *text, size_t len) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\0')
            return false;
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > CES_ANSWER_MAX_DEPTH)
                return false;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return true;
}

/* Overwrites every string of a tree: an answer's strings include its token. */
static void wipe_tree(yajl_val v) {
    if (v == NULL)
        return;
    if (YAJL_IS_STRING(v) && v->u.string != NULL) {
        explicit_bzero(v->u.string, strlen(v->u.string));
    } else if (YAJL_IS_OBJECT(v)) {
        for (size_t i = 0; i < v->u.object.len; i++)
            wipe_tree(v->u.object.values[i]);
    } else if (YAJL_IS_ARRAY(v)) {
        for (size_t i = 0; i < v->u.array.len; i++)
            wipe_tree(v->u.array.values[i]);
    }
}

static void free_tree(yajl_val v) {
    wipe_tree(v);
    yajl_tree_free(v);
}

/* The JSON object in text[0..len), or NULL (too big, too deep, not JSON, not an object, or out of
 * memory). Free with free_tree. */
static yajl_val parse_object(const char *text, size_t len) {
    if (len > CES_ANSWER_MAX_BODY || !json_shallow(text, len))
        return NULL;
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return NULL;
    memcpy(copy, text, len);
    copy[len] = '\0';
    yajl_val v = yajl_tree_parse(copy, NULL, 0);
    explicit_bzero(copy, len);
    free(copy);
    if (v != NULL && !YAJL_IS_OBJECT(v)) {
        free_tree(v);
        return NULL;
    }
    return v;
}

/* The value of key in object o (the first, when repeated), or NULL. */
static yajl_val member(yajl_val o, const char *key) {
    for (size_t i = 0; o != NULL && i < o->u.object.len; i++) {
        if (strcmp(o->u.object.keys[i], key) == 0)
            return o->u.object.values[i];
    }
    return NULL;
}

static const char *member_string(yajl_val o, const char *key) {
    yajl_val v = member(o, key);
    return YAJL_IS_STRING(v) ? v->u.string : NULL;
}

/* A whole number given as a JSON integer or as a string of digits ("3599": IMDS writes its
 * numbers as strings). Returns 0, or -1 when key is absent or holds something else. */
static int member_integer(yajl_val o, const char *key, int64_t *out) {
    yajl_val v = member(o, key);
    if (YAJL_IS_INTEGER(v)) {
        *out = YAJL_GET_INTEGER(v);
        return 0;
    }
    const char *s = YAJL_IS_STRING(v) ? v->u.string : NULL;
    if (s == NULL || *s == '\0' || strlen(s) > 18)
        return -1;
    int64_t n = 0;
    for (; *s != '\0'; s++) {
        if (!isdigit((unsigned char)*s))
            return -1;
        n = n * 10 + (*s - '0');
    }
    *out = n;
    return 0;
}

/* az's expiresOn: "2026-12-07 18:00:00.000000" in the machine's local time. */
static int local_time(const char *s, int64_t *epoch_s) {
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *end = s != NULL ? strptime(s, "%Y-%m-%d %H:%M:%S", &tm) : NULL;
    if (end == NULL || (*end != '\0' && *end != '.'))
        return -1;
    tm.tm_isdst = -1;
    time_t t = mktime(&tm);
    if (t == (time_t)-1)
        return -1;
    *epoch_s = (int64_t)t;
    return 0;
}

/* Decodes base64url (RFC 4648 section 5; '=' padding allowed, nothing else) into a new
 * NUL-terminated string of at most max bytes. Returns it (owned by the caller), or NULL. */
static char *base64url_decode(const char *in, size_t len, size_t max, size_t *out_len) {
    while (len > 0 && in[len - 1] == '=')
        len--;
    if (len % 4 == 1 || len / 4 * 3 + 3 > max)
        return NULL;
    char *out = malloc(len / 4 * 3 + 3);
    if (out == NULL)
        return NULL;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        int v = c >= 'A' && c <= 'Z'   ? c - 'A'
                : c >= 'a' && c <= 'z' ? c - 'a' + 26
                : c >= '0' && c <= '9' ? c - '0' + 52
                : c == '-'             ? 62
                : c == '_'             ? 63
                                       : -1;
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[n] = '\0';
    *out_len = n;
    return out;
}

/* The payload of a compact JWS (header.payload.signature) as a JSON object, or NULL. */
static yajl_val jwt_payload(const char *token) {
    const char *dot1 = strchr(token, '.');
    const char *dot2 = dot1 != NULL ? strchr(dot1 + 1, '.') : NULL;
    if (dot1 == NULL || dot2 == NULL || strchr(dot2 + 1, '.') != NULL || dot1 == token)
        return NULL;
    size_t len;
    char *json = base64url_decode(dot1 + 1, (size_t)(dot2 - dot1 - 1), 16 * 1024, &len);
    if (json == NULL)
        return NULL;
    yajl_val v = parse_object(json, len);
    free(json);
    return v;
}

bool ces_answer_token_usable(const char *token, size_t len) {
    if (len == 0 || len > CES_ANSWER_MAX_TOKEN)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)token[i];
        if (c <= ' ' || c >= 0x7f)
            return false;
    }
    return true;
}

/* The expiry of a successful answer in epoch milliseconds, by the order ces_answer_token gives
 * (expires_in counts from now_ms, to the millisecond: a short lifetime stays whole). Returns 0, or
 * -1 when nothing usable says it. */
static int answer_expiry(yajl_val o, const char *token, int64_t now_ms, int64_t *at_ms) {
    int64_t v;
    if (member_integer(o, "expires_on", &v) == 0) {
        *at_ms = v >= EPOCH_MIN && v <= EPOCH_MAX ? v * 1000 : -1;
        return 0;
    }
    if (member_integer(o, "expires_in", &v) == 0 && v > 0 && v <= LIFETIME_MAX_S) {
        *at_ms = now_ms + v * 1000;
        return 0;
    }
    if (local_time(member_string(o, "expiresOn"), &v) == 0) {
        *at_ms = v >= EPOCH_MIN && v <= EPOCH_MAX ? v * 1000 : -1;
        return 0;
    }
    yajl_val claims = jwt_payload(token);
    int rc = member_integer(claims, "exp", &v);
    free_tree(claims);
    if (rc == 0)
        *at_ms = v >= EPOCH_MIN && v <= EPOCH_MAX ? v * 1000 : -1;
    return rc;
}

/* Hands token (already checked) out with its expiry (ms, -1: not a date), or says why not. */
static ces_identity_err_t hand_out(const char *tok, int64_t at_ms, char **token,
                                   int64_t *expires_at_ms, char *errstr, size_t errstr_size) {
    if (at_ms < 0) {
        snprintf(errstr, errstr_size, "the token's expiry is not a date in seconds since 1970");
        return CES_IDENTITY_UNAVAILABLE;
    }
    *token = strdup(tok);
    if (*token == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_IDENTITY_NOMEM;
    }
    *expires_at_ms = at_ms;
    return CES_IDENTITY_OK;
}

ces_identity_err_t ces_answer_token(const char *body, size_t len, int64_t now_ms, char **token,
                                    int64_t *expires_at_ms, char *errstr, size_t errstr_size) {
    ces_identity_err_t err = CES_IDENTITY_UNAVAILABLE;
    yajl_val o = parse_object(body, len);
    if (o == NULL) {
        snprintf(errstr, errstr_size, "the answer is not a JSON object of at most %d KiB and "
                 "%d levels", CES_ANSWER_MAX_BODY / 1024, CES_ANSWER_MAX_DEPTH);
        goto done;
    }
    const char *tok = member_string(o, "access_token");
    if (tok == NULL)
        tok = member_string(o, "accessToken");
    if (tok == NULL) {
        snprintf(errstr, errstr_size, "the answer has no access_token");
        goto done;
    }
    if (!ces_answer_token_usable(tok, strlen(tok))) {
        snprintf(errstr, errstr_size, "the answer's access_token is empty, longer than %d bytes, "
                 "or holds a space, a control or a non-ASCII character", CES_ANSWER_MAX_TOKEN);
        goto done;
    }
    int64_t at_ms;
    if (answer_expiry(o, tok, now_ms, &at_ms) != 0) {
        snprintf(errstr, errstr_size, "the answer says nowhere when its token expires (no usable "
                 "expires_on, expires_in, expiresOn, or exp claim)");
        goto done;
    }
    err = hand_out(tok, at_ms, token, expires_at_ms, errstr, errstr_size);
done:
    free_tree(o);
    return err;
}

ces_identity_err_t ces_answer_command_output(const char *out, size_t len, int64_t now_ms,
                                             char **token, int64_t *expires_at_ms, char *errstr,
                                             size_t errstr_size) {
    while (len > 0 && isspace((unsigned char)*out)) {
        out++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)out[len - 1]))
        len--;
    if (len > 0 && out[0] == '{')
        return ces_answer_token(out, len, now_ms, token, expires_at_ms, errstr, errstr_size);
    if (!ces_answer_token_usable(out, len)) {
        snprintf(errstr, errstr_size, "the command printed neither JSON nor one token (empty, "
                 "longer than %d bytes, or with spaces, control or non-ASCII characters)",
                 CES_ANSWER_MAX_TOKEN);
        return CES_IDENTITY_UNAVAILABLE;
    }
    char *tok = strndup(out, len);
    if (tok == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_IDENTITY_NOMEM;
    }
    int64_t exp_s;
    yajl_val claims = jwt_payload(tok);
    int rc = member_integer(claims, "exp", &exp_s);
    free_tree(claims);
    ces_identity_err_t err;
    if (rc != 0) {
        snprintf(errstr, errstr_size, "the command printed a token that is no JWT with an exp "
                 "claim, so its expiry is unknown: print JSON with access_token and expires_on "
                 "instead");
        err = CES_IDENTITY_CONFIG;
    } else {
        int64_t at_ms = exp_s >= EPOCH_MIN && exp_s <= EPOCH_MAX ? exp_s * 1000 : -1;
        err = hand_out(tok, at_ms, token, expires_at_ms, errstr, errstr_size);
    }
    explicit_bzero(tok, len);
    free(tok);
    return err;
}

/* The length of the first sentence of text: up to a '.' that ends the text or comes before white
 * space (kept), or up to the first line break. Entra's descriptions go on with advice and a
 * "Trace ID: ..." line that only Microsoft's support reads. */
static size_t first_sentence(const char *text) {
    size_t i = 0;
    for (; text[i] != '\0' && text[i] != '\r' && text[i] != '\n'; i++) {
        if (text[i] == '.' && (text[i + 1] == '\0' || isspace((unsigned char)text[i + 1])))
            return i + 1;
    }
    return i;
}

/* Appends text[0..len) escaped, cut to what fits in msg. */
static void append_escaped(char *msg, size_t msg_size, const char *text, size_t len) {
    size_t used = strlen(msg);
    if (used + 1 < msg_size)
        ces_log_escape(msg + used, msg_size - used, text, len);
}

/* What an error body says, escaped into msg after "HTTP N". Returns true when it says something. */
static bool error_message(yajl_val o, char *msg, size_t msg_size) {
    enum { MAX_QUOTE = 300 };
    const char *error = member_string(o, "error");
    const char *desc = member_string(o, "error_description");
    yajl_val nested = member(o, "error"); /* ARM's {"error": {"code": ..., "message": ...}} */
    if (YAJL_IS_OBJECT(nested)) {
        error = member_string(nested, "code");
        desc = member_string(nested, "message");
    }
    if (desc == NULL)
        desc = member_string(o, "message");
    if (error == NULL && desc == NULL)
        return false;
    strncat(msg, ": ", msg_size - strlen(msg) - 1);
    if (desc != NULL && strncmp(desc, "AADSTS", 6) != 0) {
        yajl_val codes = member(o, "error_codes");
        char code[40] = "";
        if (YAJL_IS_ARRAY(codes) && codes->u.array.len > 0 &&
            YAJL_IS_INTEGER(codes->u.array.values[0]))
            snprintf(code, sizeof(code), "AADSTS%lld: ", YAJL_GET_INTEGER(codes->u.array.values[0]));
        else if (error != NULL)
            snprintf(code, sizeof(code), "%.30s: ", error);
        append_escaped(msg, msg_size, code, strlen(code));
    }
    const char *text = desc != NULL ? desc : error;
    size_t n = first_sentence(text);
    append_escaped(msg, msg_size, text, n < MAX_QUOTE ? n : MAX_QUOTE);
    return true;
}

ces_identity_err_t ces_answer_error(long status, bool imds, const char *body, size_t len,
                                    char *msg, size_t msg_size) {
    if (msg_size == 0)
        return CES_IDENTITY_UNAVAILABLE;
    snprintf(msg, msg_size, "HTTP %ld", status);
    yajl_val o = len > 0 ? parse_object(body, len) : NULL;
    bool said = o != NULL && error_message(o, msg, msg_size);
    free_tree(o);
    bool passing = status == 408 || status == 429 || status >= 500 || (imds && status == 410);
    if (status >= 400 && status < 500 && !passing && said)
        return CES_IDENTITY_REFUSED;
    if (!said && status >= 300 && status < 400)
        strncat(msg, " (redirects are not followed)", msg_size - strlen(msg) - 1);
    else if (!said)
        strncat(msg, " without an error body", msg_size - strlen(msg) - 1);
    return CES_IDENTITY_UNAVAILABLE;
}

char *ces_answer_resource(const char *scope) {
    static const char suffix[] = "/.default";
    size_t len = strlen(scope);
    if (len > sizeof(suffix) - 1 && strcmp(scope + len - (sizeof(suffix) - 1), suffix) == 0)
        len -= sizeof(suffix) - 1;
    return strndup(scope, len);
}

bool ces_answer_still_fresh(int64_t lifetime_ms, int64_t remaining_ms) {
    int64_t margin = lifetime_ms / 4 < 300000 ? lifetime_ms / 4 : 300000;
    return remaining_ms > margin;
}

/* Writes the claim value v (a string, a number, or an array of strings joined by ",") escaped. */
static void put_claim(yajl_val v, char *dst, size_t size) {
    if (YAJL_IS_STRING(v)) {
        append_escaped(dst, size, v->u.string, strlen(v->u.string));
    } else if (YAJL_IS_INTEGER(v)) {
        char n[32];
        snprintf(n, sizeof(n), "%lld", YAJL_GET_INTEGER(v));
        append_escaped(dst, size, n, strlen(n));
    } else if (YAJL_IS_ARRAY(v)) {
        for (size_t i = 0; i < v->u.array.len; i++) {
            if (i > 0)
                append_escaped(dst, size, ",", 1);
            if (YAJL_IS_STRING(v->u.array.values[i]))
                put_claim(v->u.array.values[i], dst, size);
        }
    }
}

int ces_answer_claims(const char *token, char *who, size_t who_size, char *aud, size_t aud_size,
                      int64_t *exp_s) {
    if (who_size > 0)
        who[0] = '\0';
    if (aud_size > 0)
        aud[0] = '\0';
    if (exp_s != NULL)
        *exp_s = 0;
    yajl_val o = token != NULL && strlen(token) <= CES_ANSWER_MAX_TOKEN ? jwt_payload(token) : NULL;
    if (o == NULL)
        return -1;
    static const char *const ids[] = {"oid", "appid", "azp", "sub"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        yajl_val v = member(o, ids[i]);
        if (YAJL_IS_STRING(v) || YAJL_IS_INTEGER(v)) {
            put_claim(v, who, who_size);
            break;
        }
    }
    yajl_val tid = member(o, "tid");
    if (YAJL_IS_STRING(tid) && who_size > 0) {
        const char *open = who[0] != '\0' ? " (tenant " : "(tenant ";
        append_escaped(who, who_size, open, strlen(open));
        put_claim(tid, who, who_size);
        append_escaped(who, who_size, ")", 1);
    }
    put_claim(member(o, "aud"), aud, aud_size);
    int64_t exp;
    if (exp_s != NULL && member_integer(o, "exp", &exp) == 0)
        *exp_s = exp;
    free_tree(o);
    return 0;
}
