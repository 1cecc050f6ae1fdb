/*
 * secret: reading secrets and taking Event Hubs connection strings apart, without ever quoting a
 * secret in an error.
 */
#ifndef CES_SECRET_H
#define CES_SECRET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/*
 * Reads a secret from the file secret_path: its content without surrounding white space. A relative
 * path is looked up in $CREDENTIALS_DIRECTORY when that is set (systemd's LoadCredential=). A file
 * that its group or others may read is refused (ces_secret_private). file, line and key name the
 * setting in errors, which never quote the content. Returns a new string (owned by the caller), or
 * NULL with errstr set.
 */
char *ces_secret_read_file(const char *file, int line, const char *key, const char *secret_path,
                           char *errstr, size_t errstr_size) __attribute__((warn_unused_result));

/*
 * True when a file holding a secret is private enough: no access for group or others (0600 or
 * stricter), or owned by root and readable by its group only (0640: a root-owned file shared with
 * the service's group, as Kubernetes mounts a secret with fsGroup). PostgreSQL applies the same rule
 * to its ssl_key_file; libpq refuses a loose ~/.pgpass and OpenSSH a loose key for the same reason:
 * a secret others can read is no longer a secret.
 */
bool ces_secret_private(const struct stat *st);

/* Says in errstr why a file holding a secret is refused: "'PATH' is readable by its group or
 * others (mode 0644); ..." with the fix. what names the setting ("c.conf:3: key"). */
void ces_secret_explain_loose(const char *what, const char *path, const struct stat *st,
                              char *errstr, size_t errstr_size);

/*
 * Whether text written in the configuration file is itself a secret, not a ${NAME} reference to the
 * environment: the value of a kafka.properties entry "name=value" whose name is a secret's
 * (password, secret, sasl.oauthbearer.config, ssl.key.pem, jaas), the SharedAccessKey of a
 * connection string, the password of a libpq connection string (keyword=value or URI form).
 */
bool ces_secret_property_literal(const char *item);
bool ces_secret_connection_string_literal(const char *conn);
bool ces_secret_conninfo_literal(const char *conninfo);

/* True when a librdkafka property name (name[0..len)) may hold a credential and must not be shown. */
bool ces_secret_property_name(const char *name, size_t len);

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
