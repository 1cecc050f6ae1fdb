/* identity without the network: taking answers apart, classifying errors, the cache's rule, JWT
 * claims, the requests' text, and resolving the settings (tests/unit/test_identity_http.c talks to
 * a loopback token endpoint and runs commands). */
#include "test_util.h"

#include <time.h>

#include "identity/answer.h"
#include "identity/identity.h"
#include "identity/request.h"

#define NOW_MS 1765126800000LL /* 2025-12-07 17:00:00 UTC */

/* base64url without padding of text[0..len), into a new string. */
static char *b64url(const char *text, size_t len) {
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    char *out = malloc(len / 3 * 4 + 5);
    assert_non_null(out);
    size_t n = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)text[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)(unsigned char)text[i + 1] << 8;
        if (i + 2 < len)
            v |= (unsigned char)text[i + 2];
        out[n++] = alphabet[(v >> 18) & 63];
        out[n++] = alphabet[(v >> 12) & 63];
        if (i + 1 < len)
            out[n++] = alphabet[(v >> 6) & 63];
        if (i + 2 < len)
            out[n++] = alphabet[v & 63];
    }
    out[n] = '\0';
    return out;
}

/* An unsigned JWT carrying payload (JSON text): header.payload.signature. */
static char *make_jwt(const char *payload) {
    static const char header[] = "{\"alg\":\"RS256\",\"typ\":\"JWT\"}";
    char *h = b64url(header, sizeof(header) - 1), *p = b64url(payload, strlen(payload));
    char *jwt = malloc(strlen(h) + strlen(p) + 16);
    assert_non_null(jwt);
    sprintf(jwt, "%s.%s.c2lnbmF0dXJl", h, p);
    free(h);
    free(p);
    return jwt;
}

/* ces_answer_token over a literal; returns the error and leaves the token in *token. */
static ces_identity_err_t parse(const char *body, char **token, int64_t *at_ms, char *err,
                                size_t err_size) {
    *token = NULL;
    return ces_answer_token(body, strlen(body), NOW_MS, token, at_ms, err, err_size);
}

/* Every shape of a successful answer, and which expiry wins. */
static void answers_of_every_shape_are_read(void **state) {
    (void)state;
    char err[512], *token;
    int64_t at;
    /* IMDS: numbers as strings; expires_on wins over expires_in. */
    assert_int_equal(parse("{\"access_token\":\"eyJ.imds.tok\",\"client_id\":\"c\",\"expires_in\":"
                           "\"3599\",\"expires_on\":\"1765130400\",\"resource\":\"https://r\","
                           "\"token_type\":\"Bearer\"}",
                           &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, "eyJ.imds.tok");
    assert_int_equal(at, 1765130400000LL);
    free(token);
    /* App Service: expires_on a number. */
    assert_int_equal(parse("{\"access_token\":\"a1\",\"expires_on\":1765130401,\"resource\":\"r\"}",
                           &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_int_equal(at, 1765130401000LL);
    free(token);
    /* Entra v2.0: expires_in a number of seconds from now, to the millisecond. */
    assert_int_equal(parse("{\"token_type\":\"Bearer\",\"expires_in\":3599,\"ext_expires_in\":3599,"
                           "\"access_token\":\"v2tok\"}",
                           &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, "v2tok");
    assert_int_equal(at, NOW_MS + 3599000);
    free(token);
    /* az account get-access-token: accessToken; expires_on beats the local-time expiresOn. */
    assert_int_equal(parse("{\"accessToken\":\"aztok\",\"expiresOn\":\"2030-01-01 00:00:00.000000\","
                           "\"expires_on\":1765130402,\"subscription\":\"s\",\"tenant\":\"t\","
                           "\"tokenType\":\"Bearer\"}",
                           &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, "aztok");
    assert_int_equal(at, 1765130402000LL);
    free(token);
    /* Older az: expiresOn only, in local time. */
    setenv("TZ", "UTC", 1);
    tzset();
    assert_int_equal(parse("{\"accessToken\":\"aztok\",\"expiresOn\":\"2025-12-07 18:00:00.123456\"}",
                           &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_int_equal(at, 1765130400000LL);
    free(token);
    /* Nothing but the token's own exp claim. */
    char *jwt = make_jwt("{\"aud\":\"https://r\",\"exp\":1765130403}");
    char body[1024];
    snprintf(body, sizeof(body), "{\"access_token\":\"%s\"}", jwt);
    assert_int_equal(parse(body, &token, &at, err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(token, jwt);
    assert_int_equal(at, 1765130403000LL);
    free(token);
    free(jwt);
}

/* Answers that give no usable token are UNAVAILABLE (retry), and say why without the token. */
static void garbled_answers_are_unavailable(void **state) {
    (void)state;
    char err[512], *token;
    int64_t at;
    static const char *const bodies[] = {
        "not json",
        "[\"access_token\"]",
        "{\"access_token\":\"x\"",
        "{\"token_type\":\"Bearer\",\"expires_in\":3599}",
        "{\"access_token\":\"has space\",\"expires_in\":3599}",
        "{\"access_token\":\"ctl\\u0007char\",\"expires_in\":3599}",
        "{\"access_token\":\"line\\nbreak\",\"expires_in\":3599}",
        "{\"access_token\":\"del\\u007f\",\"expires_in\":3599}",
        "{\"access_token\":\"caf\\u00e9\",\"expires_in\":3599}",
        "{\"access_token\":\"\",\"expires_in\":3599}",
        "{\"access_token\":42,\"expires_in\":3599}",
        "{\"access_token\":\"opaque-no-expiry\"}",
        "{\"access_token\":\"opaque\",\"expires_in\":-5}",
        "{\"access_token\":\"opaque\",\"expires_on\":\"1765130400000\"}", /* milliseconds */
        "{\"access_token\":\"opaque\",\"expires_on\":\"soon\",\"expires_in\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        err[0] = '\0';
        assert_int_equal(parse(bodies[i], &token, &at, err, sizeof(err)),
                         CES_IDENTITY_UNAVAILABLE);
        assert_null(token);
        assert_true(err[0] != '\0');
        assert_null(strstr(err, "opaque"));
        assert_null(strstr(err, "has space"));
    }
    /* Nested deeper than the bound (yajl's tree would recurse on it): the object and 15 arrays
     * are fine, one more is not. */
    for (int arrays = CES_ANSWER_MAX_DEPTH - 1; arrays <= CES_ANSWER_MAX_DEPTH; arrays++) {
        char deep[256] = "{\"access_token\":\"t\",\"expires_in\":1,\"x\":";
        size_t n = strlen(deep);
        for (int i = 0; i < arrays; i++)
            deep[n++] = '[';
        for (int i = 0; i < arrays; i++)
            deep[n++] = ']';
        deep[n++] = '}';
        deep[n] = '\0';
        token = NULL;
        assert_int_equal(parse(deep, &token, &at, err, sizeof(err)),
                         arrays < CES_ANSWER_MAX_DEPTH ? CES_IDENTITY_OK : CES_IDENTITY_UNAVAILABLE);
        free(token);
    }
    size_t big = CES_ANSWER_MAX_BODY + 10;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, ' ', big);
    memcpy(huge, "{\"access_token\":\"t\",\"expires_in\":5}", 35);
    huge[big] = '\0';
    assert_int_equal(ces_answer_token(huge, big, NOW_MS, &token, &at, err, sizeof(err)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_int_equal(ces_answer_token(huge, 40, NOW_MS, &token, &at, err, sizeof(err)),
                     CES_IDENTITY_OK);
    free(token);
    free(huge);
}

/* A command prints JSON, or a bare JWT dated by its exp claim; an undatable token is CONFIG. */
static void command_output_is_json_or_a_bare_jwt(void **state) {
    (void)state;
    char err[512], *token;
    int64_t at;
    const char *json = "  {\"accessToken\":\"cmdtok\",\"expires_on\":1765130400}\n";
    assert_int_equal(ces_answer_command_output(json, strlen(json), NOW_MS, &token, &at, err,
                                               sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, "cmdtok");
    free(token);
    char *jwt = make_jwt("{\"exp\":1765130404,\"oid\":\"o\"}");
    char out[1024];
    snprintf(out, sizeof(out), "%s\n", jwt);
    assert_int_equal(ces_answer_command_output(out, strlen(out), NOW_MS, &token, &at, err,
                                               sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, jwt);
    assert_int_equal(at, 1765130404000LL);
    free(token);
    free(jwt);
    const char *opaque = "opaque-token-value\n";
    assert_int_equal(ces_answer_command_output(opaque, strlen(opaque), NOW_MS, &token, &at, err,
                                               sizeof(err)),
                     CES_IDENTITY_CONFIG);
    assert_null(strstr(err, "opaque-token-value"));
    assert_non_null(strstr(err, "expires_on"));
    const char *two = "two words\n";
    assert_int_equal(ces_answer_command_output(two, strlen(two), NOW_MS, &token, &at, err,
                                               sizeof(err)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_null(strstr(err, "two words"));
    assert_int_equal(ces_answer_command_output("", 0, NOW_MS, &token, &at, err, sizeof(err)),
                     CES_IDENTITY_UNAVAILABLE);
}

/* error: the classification, then the message it gives. */
static ces_identity_err_t classify(long status, bool imds, const char *body, char *msg,
                                   size_t size) {
    return ces_answer_error(status, imds, body, strlen(body), msg, size);
}

static void error_answers_are_classified_and_quoted(void **state) {
    (void)state;
    char msg[512];
    assert_int_equal(
        classify(401, false,
                 "{\"error\":\"invalid_client\",\"error_description\":\"AADSTS7000215: Invalid "
                 "client secret provided. Ensure the secret being sent in the request is the "
                 "client secret value, not the client secret ID.\\r\\nTrace ID: 0000\\r\\n"
                 "Correlation ID: 1111\",\"error_codes\":[7000215],\"trace_id\":\"0000\"}",
                 msg, sizeof(msg)),
        CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 401: AADSTS7000215: Invalid client secret provided.");
    /* The code from error_codes when the description lacks it; a line break ends it too. */
    assert_int_equal(classify(400, false,
                              "{\"error\":\"invalid_request\",\"error_description\":\"Tenant "
                              "'nope' not found\\r\\nTrace ID: 2\",\"error_codes\":[90002]}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 400: AADSTS90002: Tenant 'nope' not found");
    assert_int_equal(classify(400, true,
                              "{\"error\":\"invalid_request\",\"error_description\":\"Identity "
                              "not found\"}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 400: invalid_request: Identity not found");
    assert_int_equal(classify(400, false,
                              "{\"statusCode\":400,\"message\":\"No managed identity found for "
                              "specified ClientId/ResourceId/PrincipalId.\"}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 400: No managed identity found for specified "
                             "ClientId/ResourceId/PrincipalId.");
    assert_int_equal(classify(403, false,
                              "{\"error\":{\"code\":\"AuthorizationFailed\",\"message\":\"No.\"}}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 403: AuthorizationFailed: No.");
    /* Passing troubles, with or without a body. */
    assert_int_equal(classify(500, false, "{\"error\":\"server_error\",\"error_description\":"
                                          "\"AADSTS50000: There was an error. Try again.\"}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_string_equal(msg, "HTTP 500: AADSTS50000: There was an error.");
    assert_int_equal(classify(503, true, "", msg, sizeof(msg)), CES_IDENTITY_UNAVAILABLE);
    assert_string_equal(msg, "HTTP 503 without an error body");
    assert_int_equal(classify(429, true, "{\"error\":\"too many\"}", msg, sizeof(msg)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_int_equal(classify(408, false, "{\"error\":\"slow\"}", msg, sizeof(msg)),
                     CES_IDENTITY_UNAVAILABLE);
    /* 410: IMDS is being updated (retry); from Entra it is a refusal. */
    assert_int_equal(classify(410, true, "{\"error\":\"gone\"}", msg, sizeof(msg)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_int_equal(classify(410, false, "{\"error\":\"gone\"}", msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    /* A 4xx without an error body is no word from Entra: a proxy's page, a wrong path. */
    assert_int_equal(classify(404, false, "<html>Not Found</html>", msg, sizeof(msg)),
                     CES_IDENTITY_UNAVAILABLE);
    assert_string_equal(msg, "HTTP 404 without an error body");
    assert_int_equal(classify(302, false, "", msg, sizeof(msg)), CES_IDENTITY_UNAVAILABLE);
    assert_string_equal(msg, "HTTP 302 (redirects are not followed)");
    /* An endpoint's text is escaped and cut. */
    assert_int_equal(classify(400, false,
                              "{\"error\":\"x\\u001b[2J\",\"error_description\":\"evil\\u001b]0;"
                              "title\\u0007 text\"}",
                              msg, sizeof(msg)),
                     CES_IDENTITY_REFUSED);
    assert_string_equal(msg, "HTTP 400: x\\x1b[2J: evil\\x1b]0;title\\x07 text");
    char *long_desc = malloc(4000);
    assert_non_null(long_desc);
    strcpy(long_desc, "{\"error_description\":\"");
    memset(long_desc + strlen(long_desc), 'a', 3000);
    strcpy(long_desc + 22 + 3000, "\"}");
    assert_int_equal(classify(401, false, long_desc, msg, sizeof(msg)), CES_IDENTITY_REFUSED);
    assert_true(strlen(msg) < 320);
    free(long_desc);
    char tiny[12];
    classify(401, false, "{\"error\":\"invalid_client\"}", tiny, sizeof(tiny));
    assert_string_equal(tiny, "HTTP 401: i");
}

/* The cache hands a token out while more than min(300 s, lifetime / 4) of it is left. */
static void the_refresh_margin_is_min_300s_or_a_quarter(void **state) {
    (void)state;
    assert_true(ces_answer_still_fresh(3600000, 300001));
    assert_false(ces_answer_still_fresh(3600000, 300000));
    assert_true(ces_answer_still_fresh(86400000, 300001)); /* 24 h managed identity token */
    assert_false(ces_answer_still_fresh(86400000, 299000));
    assert_true(ces_answer_still_fresh(600000, 150001));
    assert_false(ces_answer_still_fresh(600000, 150000));
    assert_true(ces_answer_still_fresh(20000, 5001));
    assert_false(ces_answer_still_fresh(20000, 5000));
    assert_false(ces_answer_still_fresh(20000, -1));
    assert_false(ces_answer_still_fresh(0, 0));
}

static void claims_name_who_and_the_audience(void **state) {
    (void)state;
    char who[128], aud[128];
    int64_t exp;
    char *jwt = make_jwt("{\"aud\":\"https://ns.servicebus.windows.net\",\"iss\":\"i\",\"exp\":"
                         "1765130400,\"oid\":\"11111111-2222\",\"appid\":\"app\",\"sub\":\"s\","
                         "\"tid\":\"tenant-9\"}");
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), &exp), 0);
    assert_string_equal(who, "11111111-2222 (tenant tenant-9)");
    assert_string_equal(aud, "https://ns.servicebus.windows.net");
    assert_int_equal(exp, 1765130400);
    free(jwt);
    jwt = make_jwt("{\"aud\":[\"a1\",\"a2\",3],\"azp\":\"client-x\",\"sub\":\"s\"}");
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), NULL), 0);
    assert_string_equal(who, "client-x");
    assert_string_equal(aud, "a1,a2,");
    free(jwt);
    jwt = make_jwt("{\"sub\":\"esc\\u001bape\\n\",\"tid\":\"t\"}");
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), &exp), 0);
    assert_string_equal(who, "esc\\x1bape\\n (tenant t)");
    assert_string_equal(aud, "");
    assert_int_equal(exp, 0);
    free(jwt);
    jwt = make_jwt("{\"tid\":\"t\"}");
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), &exp), 0);
    assert_string_equal(who, "(tenant t)");
    free(jwt);
    /* Cut to small buffers. */
    jwt = make_jwt("{\"oid\":\"0123456789abcdef\",\"aud\":\"0123456789abcdef\"}");
    assert_int_equal(ces_identity_token_claims(jwt, who, 8, aud, 5, NULL), 0);
    assert_string_equal(who, "0123456");
    assert_string_equal(aud, "0123");
    free(jwt);
}

static void hostile_tokens_have_no_claims(void **state) {
    (void)state;
    char who[64], aud[64];
    int64_t exp = 7;
    static const char *const bad[] = {
        "opaque-token",        "a.b",     "a.b.c.d.e", ".e30.", "h.!!!notbase64.s", "h.e30x.s",
        "h.W10.s" /* [] */,    "h.bm90IGpzb24.s" /* not json */,
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strcpy(who, "stale");
        assert_int_equal(ces_identity_token_claims(bad[i], who, sizeof(who), aud, sizeof(aud), &exp),
                         -1);
        assert_string_equal(who, "");
        assert_string_equal(aud, "");
        assert_int_equal(exp, 0);
    }
    assert_int_equal(ces_identity_token_claims(NULL, who, sizeof(who), aud, sizeof(aud), NULL), -1);
    /* Deep: 2000 nested arrays in the payload. */
    char *deep = malloc(4100);
    assert_non_null(deep);
    strcpy(deep, "{\"oid\":");
    size_t n = strlen(deep);
    for (int i = 0; i < 2000; i++)
        deep[n++] = '[';
    for (int i = 0; i < 2000; i++)
        deep[n++] = ']';
    strcpy(deep + n, "}");
    char *jwt = make_jwt(deep);
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), NULL), -1);
    free(jwt);
    free(deep);
    /* Huge: a 20 KiB payload. */
    char *huge = malloc(20 * 1024 + 32);
    assert_non_null(huge);
    strcpy(huge, "{\"oid\":\"");
    memset(huge + 8, 'x', 20 * 1024);
    strcpy(huge + 8 + 20 * 1024, "\"}");
    jwt = make_jwt(huge);
    assert_int_equal(ces_identity_token_claims(jwt, who, sizeof(who), aud, sizeof(aud), NULL), -1);
    free(jwt);
    free(huge);
}

static void tokens_must_be_printable_ascii_without_spaces(void **state) {
    (void)state;
    assert_true(ces_answer_token_usable("eyJ0eXAi.eyJhdWQi.c2ln-_~+/=", 28));
    assert_false(ces_answer_token_usable("", 0));
    assert_false(ces_answer_token_usable("a b", 3));
    assert_false(ces_answer_token_usable("a\tb", 3));
    assert_false(ces_answer_token_usable("ab\n", 3));
    assert_false(ces_answer_token_usable("a\x7f", 2));
    assert_false(ces_answer_token_usable("caf\xc3\xa9", 5));
    assert_false(ces_answer_token_usable("a\0b", 3));
    char *long_token = malloc(CES_ANSWER_MAX_TOKEN + 1);
    assert_non_null(long_token);
    memset(long_token, 'a', CES_ANSWER_MAX_TOKEN + 1);
    assert_true(ces_answer_token_usable(long_token, CES_ANSWER_MAX_TOKEN));
    assert_false(ces_answer_token_usable(long_token, CES_ANSWER_MAX_TOKEN + 1));
    free(long_token);
}

static void resources_and_requests_are_spelled_right(void **state) {
    (void)state;
    struct {
        const char *scope, *resource;
    } cases[] = {
        {"https://ns.servicebus.windows.net/.default", "https://ns.servicebus.windows.net"},
        {"https://ossrdbms-aad.database.windows.net/.default",
         "https://ossrdbms-aad.database.windows.net"},
        {"https://x/", "https://x/"},
        {"api://app-id", "api://app-id"},
        {"/.default", "/.default"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *r = ces_answer_resource(cases[i].scope);
        assert_string_equal(r, cases[i].resource);
        free(r);
    }
    char *url = ces_request_managed_url("http://169.254.169.254/metadata/identity/oauth2/token",
                                        "2018-02-01", "https://ns.servicebus.windows.net", NULL);
    assert_string_equal(url, "http://169.254.169.254/metadata/identity/oauth2/token?api-version="
                             "2018-02-01&resource=https%3A%2F%2Fns.servicebus.windows.net");
    free(url);
    url = ces_request_managed_url("http://h/msi/token?x=1", "2019-08-01", "r", "c d&e");
    assert_string_equal(url, "http://h/msi/token?x=1&api-version=2019-08-01&resource=r&"
                             "client_id=c%20d%26e");
    free(url);
    url = ces_request_token_url("https://login.microsoftonline.com/", "contoso.onmicrosoft.com");
    assert_string_equal(url, "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/"
                             "v2.0/token");
    free(url);
    url = ces_request_token_url("http://127.0.0.1:8080", "t-1");
    assert_string_equal(url, "http://127.0.0.1:8080/t-1/oauth2/v2.0/token");
    free(url);
    char *form = ces_request_token_form("cid", "https://r/.default", "s3+/=&~x", NULL);
    assert_string_equal(form, "client_id=cid&scope=https%3A%2F%2Fr%2F.default&grant_type="
                              "client_credentials&client_secret=s3%2B%2F%3D%26~x");
    ces_request_free_secret(form);
    form = ces_request_token_form("cid", "s", NULL, "eyJ.a.b");
    assert_string_equal(form, "client_id=cid&scope=s&grant_type=client_credentials&"
                              "client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-"
                              "assertion-type%3Ajwt-bearer&client_assertion=eyJ.a.b");
    ces_request_free_secret(form);
    ces_request_free_secret(NULL);
}

static void source_names_round_trip(void **state) {
    (void)state;
    static const char *const names[] = {"auto",          "managed_identity", "app_service",
                                        "workload_identity", "client_secret", "command"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        ces_identity_source_t source;
        assert_int_equal(ces_identity_source_parse(names[i], &source), 0);
        assert_int_equal(source, (ces_identity_source_t)i);
        assert_string_equal(ces_identity_source_name(source), names[i]);
    }
    ces_identity_source_t source = CES_IDENTITY_SOURCE_COMMAND;
    assert_int_equal(ces_identity_source_parse("imds", &source), -1);
    assert_int_equal(ces_identity_source_parse("", &source), -1);
    assert_int_equal(source, CES_IDENTITY_SOURCE_COMMAND);
}

static const char *const azure_env[] = {"AZURE_CLIENT_ID",          "AZURE_TENANT_ID",
                                        "AZURE_AUTHORITY_HOST",     "AZURE_FEDERATED_TOKEN_FILE",
                                        "IDENTITY_ENDPOINT",        "IDENTITY_HEADER"};

static int clear_env(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(azure_env) / sizeof(azure_env[0]); i++)
        unsetenv(azure_env[i]);
    return 0;
}

/* _new with s; returns the description (into desc) or NULL with err set. */
static bool make(const ces_identity_settings_t *s, char *desc, size_t desc_size, char *err,
                 size_t err_size) {
    err[0] = '\0';
    ces_identity_t *id = ces_identity_new(s, err, err_size);
    if (id == NULL)
        return false;
    snprintf(desc, desc_size, "%s", ces_identity_describe(id));
    ces_identity_destroy(id);
    return true;
}

/* AUTO picks like DefaultAzureCredential, from the settings or the SDKs' variables, and says so. */
static void auto_picks_the_source_and_says_which(void **state) {
    (void)state;
    char desc[1024], err[512];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_AUTO};
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "managed identity (IMDS http://169.254.169.254/metadata/identity/"
                              "oauth2/token, system-assigned; source auto: no federated token "
                              "file, no App Service endpoint)");
    setenv("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token", 1);
    setenv("IDENTITY_HEADER", "header-secret-value", 1);
    setenv("AZURE_CLIENT_ID", "uami-1", 1);
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "managed identity (App Service endpoint http://localhost:42356/msi/"
                              "token, client_id uami-1; source auto: IDENTITY_ENDPOINT and "
                              "IDENTITY_HEADER are set)");
    /* An IMDS endpoint set explicitly wins over App Service's variables. */
    s.imds_endpoint = "http://127.0.0.1:9/token";
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_non_null(strstr(desc, "managed identity (IMDS http://127.0.0.1:9/token, client_id "));
    s.imds_endpoint = NULL;
    setenv("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/azure/tokens/azure-identity-token", 1);
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs tenant_id (or AZURE_TENANT_ID)");
    setenv("AZURE_TENANT_ID", "72f988bf-86f1-41af-91ab-2d7cd011db47", 1);
    setenv("AZURE_AUTHORITY_HOST", "https://login.chinacloudapi.cn/", 1);
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "workload identity (tenant 72f988bf-86f1-41af-91ab-2d7cd011db47, "
                              "client uami-1, token file /var/run/secrets/azure/tokens/azure-"
                              "identity-token, authority https://login.chinacloudapi.cn/; source "
                              "auto: a federated token file is set)");
    /* Settings win over the environment. */
    s.source = CES_IDENTITY_SOURCE_MANAGED_IDENTITY;
    s.client_id = "from-settings";
    s.identity_endpoint = "http://127.0.0.1:1/msi";
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "managed identity (App Service endpoint http://127.0.0.1:1/msi, "
                              "client_id from-settings)");
    assert_null(strstr(desc, "header-secret-value"));
}

/* Each source names what it is missing; values that cannot go into a URL or a header are refused. */
static void unusable_settings_are_refused(void **state) {
    (void)state;
    char desc[1024], err[512];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_CLIENT_SECRET, .tenant_id = "t",
                                 .client_id = "c"};
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs client_secret");
    s.client_secret = "the-client-secret";
    assert_true(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "service principal with a client secret (tenant t, client c, "
                              "authority https://login.microsoftonline.com/)");
    s.tenant_id = "t/../x";
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_non_null(strstr(err, "tenant id"));
    s.tenant_id = "t";
    s.authority_host = "login.microsoftonline.com";
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_non_null(strstr(err, "authority host"));
    s.authority_host = NULL;
    s.timeout_ms = -1;
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_non_null(strstr(err, "timeout"));
    s.timeout_ms = 0;
    s.client_secret = "two\r\nlines";
    assert_false(make(&s, desc, sizeof(desc), err, sizeof(err)));
    assert_null(strstr(err, "two"));

    ces_identity_settings_t w = {.source = CES_IDENTITY_SOURCE_WORKLOAD_IDENTITY, .tenant_id = "t"};
    assert_false(make(&w, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs client_id (or AZURE_CLIENT_ID)");
    w.client_id = "c";
    assert_false(make(&w, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs federated_token_file (or "
                             "AZURE_FEDERATED_TOKEN_FILE)");

    ces_identity_settings_t a = {.source = CES_IDENTITY_SOURCE_APP_SERVICE};
    assert_false(make(&a, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs identity_endpoint (or IDENTITY_ENDPOINT)");
    a.identity_endpoint = "http://127.0.0.1:1/msi";
    assert_false(make(&a, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs identity_header (or IDENTITY_HEADER)");
    a.identity_header = "hdr\r\nX-Injected: 1";
    assert_false(make(&a, desc, sizeof(desc), err, sizeof(err)));
    assert_null(strstr(err, "Injected"));

    ces_identity_settings_t c = {.source = CES_IDENTITY_SOURCE_COMMAND};
    assert_false(make(&c, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(err, "the identity needs command");
    c.command = "az account get-access-token --password hunter2";
    assert_true(make(&c, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "command (az ...)");
    c.command = "/usr/local/bin/\x1b[31mtoken";
    assert_true(make(&c, desc, sizeof(desc), err, sizeof(err)));
    assert_string_equal(desc, "command (/usr/local/bin/\\x1b[31mtoken)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(answers_of_every_shape_are_read),
        cmocka_unit_test(garbled_answers_are_unavailable),
        cmocka_unit_test(command_output_is_json_or_a_bare_jwt),
        cmocka_unit_test(error_answers_are_classified_and_quoted),
        cmocka_unit_test(the_refresh_margin_is_min_300s_or_a_quarter),
        cmocka_unit_test(claims_name_who_and_the_audience),
        cmocka_unit_test(hostile_tokens_have_no_claims),
        cmocka_unit_test(tokens_must_be_printable_ascii_without_spaces),
        cmocka_unit_test(resources_and_requests_are_spelled_right),
        cmocka_unit_test(source_names_round_trip),
        cmocka_unit_test_setup(auto_picks_the_source_and_says_which, clear_env),
        cmocka_unit_test_setup(unusable_settings_are_refused, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
