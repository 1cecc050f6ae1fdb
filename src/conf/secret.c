#include "conf/secret.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

char *ces_secret_read_file(const char *file, int line, const char *key, const char *secret_path,
                           char *errstr, size_t errstr_size) {
    enum { MAX_SECRET = 65536 };
    char resolved[4096];
    const char *creds = getenv("CREDENTIALS_DIRECTORY");
    if (secret_path[0] != '/' && creds != NULL && creds[0] != '\0') {
        snprintf(resolved, sizeof(resolved), "%s/%s", creds, secret_path);
        secret_path = resolved;
    }
    FILE *f = fopen(secret_path, "r");
    if (f == NULL) {
        snprintf(errstr, errstr_size, "%s:%d: %s: cannot read '%s': %s", file, line, key,
                 secret_path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        snprintf(errstr, errstr_size, "%s:%d: %s: cannot stat '%s': %s", file, line, key,
                 secret_path, strerror(errno));
        fclose(f);
        return NULL;
    }
    if (!ces_secret_private(&st)) {
        char what[512];
        snprintf(what, sizeof(what), "%s:%d: %s", file, line, key);
        ces_secret_explain_loose(what, secret_path, &st, errstr, errstr_size);
        fclose(f);
        return NULL;
    }
    char *buf = malloc(MAX_SECRET + 1);
    size_t len = buf ? fread(buf, 1, MAX_SECRET + 1, f) : 0;
    bool failed = buf == NULL || ferror(f);
    fclose(f);
    if (failed || len > MAX_SECRET) {
        snprintf(errstr, errstr_size, "%s:%d: %s: '%s' %s", file, line, key, secret_path,
                 buf == NULL ? "cannot be read: out of memory"
                 : failed    ? "cannot be read"
                             : "is too large for a secret");
        if (buf != NULL)
            explicit_bzero(buf, len);
        free(buf);
        return NULL;
    }
    size_t start = 0;
    while (start < len && isspace((unsigned char)buf[start]))
        start++;
    while (len > start && isspace((unsigned char)buf[len - 1]))
        len--;
    memmove(buf, buf + start, len - start);
    buf[len - start] = '\0';
    if (buf[0] == '\0') {
        snprintf(errstr, errstr_size, "%s:%d: %s: '%s' is empty", file, line, key, secret_path);
        free(buf);
        return NULL;
    }
    return buf;
}

bool ces_secret_private(const struct stat *st) {
    if ((st->st_mode & (S_IRWXG | S_IRWXO)) == 0)
        return true;
    return st->st_uid == 0 && (st->st_mode & (S_IWGRP | S_IXGRP | S_IRWXO)) == 0;
}

void ces_secret_explain_loose(const char *what, const char *path, const struct stat *st,
                              char *errstr, size_t errstr_size) {
    snprintf(errstr, errstr_size,
             "%s: '%s' holds a secret and is readable by its group or others (mode %04o); "
             "make it private: chmod 600 '%s' (or owned by root and 0640, shared with the "
             "service's group only)",
             what, path, (unsigned)(st->st_mode & 07777), path);
}

/* A value given in the text itself: not empty and not a ${NAME} reference. */
static bool literal(const char *v, size_t len) {
    while (len > 0 && (*v == ' ' || *v == '\t' || *v == '\'' || *v == '"')) {
        v++;
        len--;
    }
    return len > 0 && strncmp(v, "${", len < 2 ? len : 2) != 0;
}

/* The value after the first "keyword=" (case-insensitive, at the start or after a separator in
 * seps, blanks allowed around '='), or NULL. */
static const char *value_of(const char *text, const char *keyword, const char *seps) {
    size_t klen = strlen(keyword);
    for (const char *p = text; (p = strcasestr(p, keyword)) != NULL; p += klen) {
        if (p != text && strchr(seps, p[-1]) == NULL)
            continue;
        const char *q = p + klen;
        while (*q == ' ' || *q == '\t')
            q++;
        if (*q == '=') {
            for (q++; *q == ' ' || *q == '\t';)
                q++;
            return q;
        }
    }
    return NULL;
}

bool ces_secret_property_literal(const char *item) {
    const char *eq = strchr(item, '=');
    if (eq == NULL)
        return false;
    static const char *const words[] = {"password", "secret", "sasl.oauthbearer.config",
                                        "ssl.key.pem", "jaas"};
    char name[128];
    size_t n = (size_t)(eq - item) < sizeof(name) - 1 ? (size_t)(eq - item) : sizeof(name) - 1;
    for (size_t i = 0; i < n; i++)
        name[i] = (char)tolower((unsigned char)item[i]);
    name[n] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (strstr(name, words[i]) != NULL)
            return literal(eq + 1, strlen(eq + 1));
    }
    return false;
}

bool ces_secret_connection_string_literal(const char *conn) {
    const char *v = value_of(conn, "sharedaccesskey", "; \t");
    return v != NULL && literal(v, strcspn(v, ";"));
}

bool ces_secret_conninfo_literal(const char *conninfo) {
    const char *v = value_of(conninfo, "password", " \t\n?&");
    if (v != NULL && literal(v, strcspn(v, " \t\n&")))
        return true;
    /* postgresql://user:password@host/...: a colon in the part before the '@'. */
    const char *scheme = strstr(conninfo, "://");
    if (scheme == NULL || (strncasecmp(conninfo, "postgres", 8) != 0))
        return false;
    const char *authority = scheme + 3;
    size_t len = strcspn(authority, "/?");
    const char *at = memchr(authority, '@', len);
    const char *colon = at ? memchr(authority, ':', (size_t)(at - authority)) : NULL;
    return colon != NULL && literal(colon + 1, (size_t)(at - colon - 1));
}

bool ces_secret_one_line(const char *text) {
    for (const char *p = text; *p != '\0'; p++) {
        if (iscntrl((unsigned char)*p))
            return false;
    }
    return true;
}

int ces_secret_eventhubs_host(const char *conn, char *host, size_t host_size) {
    const char *p = conn;
    while (*p != '\0') {
        size_t len = strcspn(p, ";");
        static const char key[] = "endpoint=";
        if (len > sizeof(key) - 1 && strncasecmp(p, key, sizeof(key) - 1) == 0) {
            const char *v = p + sizeof(key) - 1, *end = p + len;
            while (v < end && isspace((unsigned char)*v))
                v++;
            const char *scheme = strstr(v, "://");
            if (scheme == NULL || scheme >= end)
                return -1;
            v = scheme + 3;
            size_t n = 0;
            while (v + n < end && v[n] != '/')
                n++;
            if (n == 0 || n >= host_size)
                return -1;
            for (size_t i = 0; i < n; i++) {
                if (!isalnum((unsigned char)v[i]) && v[i] != '.' && v[i] != '-' && v[i] != ':')
                    return -1;
            }
            memcpy(host, v, n);
            host[n] = '\0';
            return 0;
        }
        p += len;
        if (*p == ';')
            p++;
    }
    return -1;
}

char *ces_secret_shared_access_key(const char *conn) {
    static const char key[] = "sharedaccesskey=";
    for (const char *p = conn; *p != '\0';) {
        size_t len = strcspn(p, ";");
        if (len >= sizeof(key) - 1 + 8 && strncasecmp(p, key, sizeof(key) - 1) == 0)
            return strndup(p + sizeof(key) - 1, len - (sizeof(key) - 1));
        p += len;
        if (*p == ';')
            p++;
    }
    return NULL;
}

bool ces_secret_property_name(const char *name, size_t len) {
    static const char *const words[] = {"password", "secret", "key", "token", "jaas"};
    char lower[128];
    if (len >= sizeof(lower))
        len = sizeof(lower) - 1;
    for (size_t i = 0; i < len; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
    lower[len] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (strstr(lower, words[i]) != NULL)
            return true;
    }
    return false;
}
