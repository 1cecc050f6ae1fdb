#include "conf/secret.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
