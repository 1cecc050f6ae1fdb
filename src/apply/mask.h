/*
 * mask: the keyed hash that masks a sensitive column (a table rule's `columns.mask`, "hash").
 *
 * A masked value is HMAC-SHA256 of the value's text as the event carries it, under the key of
 * schema.mask_key_file, written as 64 lowercase hexadecimal digits. Equal values give equal
 * masks, in every table and across restarts, so masked columns stay joinable; without the key a
 * mask cannot be computed for a guessed value, which a plain hash of a short value (a card number,
 * a birth date) would allow. The key is never logged.
 */
#ifndef CES_MASK_H
#define CES_MASK_H

#include <stddef.h>

/* The length of a mask's text, without its terminating NUL. */
#define CES_MASK_HEX_LEN 64

typedef struct ces_mask_s ces_mask_t;

/* A hasher keyed with key[0..key_len), which is copied (and wiped when destroyed). Returns NULL
 * when out of memory or when libcrypto offers no HMAC-SHA256. */
ces_mask_t *ces_mask_new(const void *key, size_t key_len);

void ces_mask_destroy(ces_mask_t *mask); /* accepts NULL */

/* Writes the mask of value[0..len) into out (CES_MASK_HEX_LEN digits and a NUL). Returns 0, or
 * -1 when libcrypto fails (out of memory). */
int ces_mask_hex(ces_mask_t *mask, const void *value, size_t len,
                 char out[CES_MASK_HEX_LEN + 1]);

#endif
