/*
 * keys: the table of configuration keys (private to conf), and what walks it whole: printing the
 * effective settings, comparing two configurations, describing the keys for the manual page.
 */
#ifndef CES_CONF_KEYS_H
#define CES_CONF_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KEY_STRING, KEY_INT, KEY_BOOL, KEY_STRING_LIST } key_type_t;

typedef struct {
    const char *name; /* "group.key" */
    key_type_t type;
    size_t offset; /* of the field in ces_config_t */
    const char *default_value; /* NULL: no default (required, or empty list) */
    bool required_for_daemon;
    bool required_for_replay;
    int64_t min, max; /* KEY_INT bounds */
    bool reloadable;  /* SIGHUP may change it (RELOAD); others need a restart (RESTART) */
} ces_config_key_t;

/* The single table of configuration keys (documented one by one in conf/ces2pg.conf). */
extern const ces_config_key_t ces_config_keys[];
extern const size_t ces_config_nkeys;

#endif
