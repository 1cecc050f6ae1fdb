/*
 * secret: reading secrets and taking Event Hubs connection strings apart, without ever quoting a
 * secret in an error.
 */
#ifndef CES_SECRET_H
#define CES_SECRET_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Reads a secret from the file secret_path: its content without surrounding white space. A relative
 * path is looked up in $CREDENTIALS_DIRECTORY when that is set (systemd's LoadCredential=). file,
 * line and key name the setting in errors, which never quote the content. Returns a new string
 * (owned by the caller), or NULL with errstr set.
 */
char *ces_secret_read_file(const char *file, int line, const char *key, const char *secret_path,
                           char *errstr, size_t errstr_size) __attribute__((warn_unused_result));

/* True when text is one line without control characters. */
bool ces_secret_one_line(const char *text);

/* The Event Hubs namespace host of a connection string's Endpoint=sb://HOST/ part, copied into
 * host. Returns 0, or -1 when there is no usable Endpoint. */
int ces_secret_eventhubs_host(const char *conn, char *host, size_t host_size);

/* The SharedAccessKey=... value of an Event Hubs connection string (a new string owned by the
 * caller), or NULL when there is none of at least 8 characters (redacting a short common string
 * would garble the log) or memory runs out. */
char *ces_secret_shared_access_key(const char *conn);

#endif
