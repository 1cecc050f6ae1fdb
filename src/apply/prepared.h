/*
 * prepared: the statements a connection has prepared, by signature.
 *
 * Statements are prepared once per connection: the cache (ces_prepared_t) outlives attempts and
 * maps a statement's signature (bulk.h) to its name and the session epoch it was prepared in, so a
 * new connection prepares again without being told. The Parse goes through the attempt's pipeline
 * (inflight.h), ahead of the statements that use it.
 */
#ifndef CES_PREPARED_H
#define CES_PREPARED_H

#include <stddef.h>

#include "apply/bulk.h"
#include "apply/catalog.h"
#include "apply/inflight.h"
#include "apply/metadata.h"

typedef struct ces_prepared_s ces_prepared_t;

/* Returns an empty cache, or NULL when out of memory. Owned by the caller. */
ces_prepared_t *ces_prepared_new(void) __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_prepared_destroy(ces_prepared_t *prepared);

/* The name of the prepared statement of kind on table t with the columns cols[0..ncols) (NULL for
 * a delete: the key), whose signature is sig[0..sig_len): found, or made and its Parse sent into
 * inflight when the connection has not seen it yet (item: the batch index it is for, -1 for a bulk
 * statement). Names are spelt by metadata. Returns a string owned by the cache, or NULL with the
 * error in inflight's record. */
const char *ces_prepared_get(ces_prepared_t *prepared, ces_inflight_t *inflight,
                             const ces_metadata_t *metadata, const char *sig, size_t sig_len,
                             long item, ces_bulk_kind_t kind, const ces_catalog_desc_t *t,
                             const long *cols, size_t ncols) __attribute__((warn_unused_result));

#endif
