#include "util/strbuf.h"

#include "util/array.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation: most statements fit, so they need one malloc. */
#define STRBUF_FIRST_CAPACITY 256

void ces_strbuf_add(ces_strbuf_t *sb, const char *s) {
    size_t n = strlen(s);
    if (sb->failed)
        return;
    char *b = CES_ARRAY_RESERVE(sb->buf, sb->cap, sb->len + n + 1, STRBUF_FIRST_CAPACITY);
    if (b == NULL) {
        sb->failed = true;
        return;
    }
    sb->buf = b;
    memcpy(sb->buf + sb->len, s, n + 1);
    sb->len += n;
}

void ces_strbuf_addf(ces_strbuf_t *sb, const char *fmt, ...) {
    char tmp[CES_STRBUF_MAX_FRAGMENT + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        sb->failed = true;
        return;
    }
    ces_strbuf_add(sb, tmp);
}

void ces_strbuf_reset(ces_strbuf_t *sb) {
    sb->len = 0;
    sb->failed = false;
    if (sb->buf != NULL)
        sb->buf[0] = '\0';
}

void ces_strbuf_free(ces_strbuf_t *sb) {
    free(sb->buf);
    *sb = (ces_strbuf_t){0};
}
