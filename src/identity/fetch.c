#include "identity/fetch.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "identity/answer.h"
#include "util/log.h"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

/* curl_global_init is not safe to race with itself, and the first fetch may come from
 * librdkafka's background thread while the main thread connects to PostgreSQL. */
static void global_init(void) {
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

typedef struct {
    char *buf; /* CES_ANSWER_MAX_BODY + 1 bytes: never reallocated, so no stray copy of a token */
    size_t len;
    bool too_big;
} sink_t;

static size_t on_data(char *data, size_t size, size_t nmemb, void *userdata) {
    sink_t *sink = userdata;
    size_t n = size * nmemb;
    if (n > CES_ANSWER_MAX_BODY - sink->len) {
        sink->too_big = true;
        return 0; /* aborts the transfer */
    }
    memcpy(sink->buf + sink->len, data, n);
    sink->len += n;
    return n;
}

static void free_headers(struct curl_slist *list) {
    for (struct curl_slist *l = list; l != NULL; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
    curl_slist_free_all(list);
}

/* Sets every option of req on curl; returns -1 when memory runs out. */
static int set_options(CURL *curl, const ces_fetch_request_t *req, struct curl_slist **headers,
                       sink_t *sink, char *curl_err) {
    for (const char *const *h = req->headers; h != NULL && *h != NULL; h++) {
        struct curl_slist *more = curl_slist_append(*headers, *h);
        if (more == NULL)
            return -1;
        *headers = more;
    }
    bool ok = curl_easy_setopt(curl, CURLOPT_URL, req->url) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)req->timeout_ms) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)req->timeout_ms) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L) == CURLE_OK &&
#if LIBCURL_VERSION_NUM >= 0x075500
              curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
#else
              curl_easy_setopt(curl, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS) ==
                  CURLE_OK &&
#endif
              curl_easy_setopt(curl, CURLOPT_USERAGENT, "ces2pg/" CES2PG_VERSION) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_HTTPHEADER, *headers) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_WRITEDATA, sink) == CURLE_OK &&
              curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_err) == CURLE_OK;
    if (ok && req->form != NULL)
        ok = curl_easy_setopt(curl, CURLOPT_POSTFIELDS, req->form) == CURLE_OK &&
             curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(req->form)) == CURLE_OK;
    if (ok && req->ca_file != NULL)
        ok = curl_easy_setopt(curl, CURLOPT_CAINFO, req->ca_file) == CURLE_OK;
    if (ok && req->no_proxy)
        ok = curl_easy_setopt(curl, CURLOPT_NOPROXY, "*") == CURLE_OK;
    return ok ? 0 : -1;
}

ces_identity_err_t ces_fetch(const ces_fetch_request_t *req, ces_fetch_answer_t *answer,
                             char *errstr, size_t errstr_size) {
    ces_identity_err_t err = CES_IDENTITY_NOMEM;
    struct curl_slist *headers = NULL;
    char curl_err[CURL_ERROR_SIZE] = "";
    sink_t sink = {malloc(CES_ANSWER_MAX_BODY + 1), 0, false};
    CURL *curl = NULL;
    answer->status = 0;
    answer->body = NULL;
    answer->len = 0;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) {
        snprintf(errstr, errstr_size, "libcurl cannot start: %s", curl_easy_strerror(global_rc));
        goto done;
    }
    if (sink.buf == NULL || (curl = curl_easy_init()) == NULL ||
        set_options(curl, req, &headers, &sink, curl_err) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        goto done;
    }
    CURLcode rc = curl_easy_perform(curl);
    err = CES_IDENTITY_UNAVAILABLE;
    if (sink.too_big) {
        snprintf(errstr, errstr_size, "the answer is longer than %d KiB",
                 CES_ANSWER_MAX_BODY / 1024);
        goto done;
    }
    if (rc != CURLE_OK) {
        const char *why = curl_err[0] != '\0' ? curl_err : curl_easy_strerror(rc);
        char escaped[CES_LOG_ESCAPED_SIZE(CURL_ERROR_SIZE)];
        ces_log_escape(escaped, sizeof(escaped), why, strlen(why));
        if (rc == CURLE_OPERATION_TIMEDOUT)
            snprintf(errstr, errstr_size, "no answer within %d ms (%s)", req->timeout_ms, escaped);
        else
            snprintf(errstr, errstr_size, "%s", escaped);
        goto done;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &answer->status);
    sink.buf[sink.len] = '\0';
    answer->body = sink.buf;
    answer->len = sink.len;
    sink.buf = NULL;
    err = CES_IDENTITY_OK;
done:
    if (curl != NULL)
        curl_easy_cleanup(curl);
    free_headers(headers);
    if (sink.buf != NULL) {
        explicit_bzero(sink.buf, sink.len);
        free(sink.buf);
    }
    return err;
}

void ces_fetch_answer_free(ces_fetch_answer_t *answer) {
    if (answer->body != NULL) {
        explicit_bzero(answer->body, answer->len);
        free(answer->body);
    }
    answer->body = NULL;
    answer->len = 0;
}
