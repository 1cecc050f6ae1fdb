/*
 * mask: HMAC-SHA256 for masked columns (mask.h), with OpenSSL 3's EVP_MAC.
 */
#include "apply/mask.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdlib.h>
#include <string.h>

struct ces_mask_s {
    EVP_MAC *mac;
    /* Initialised with the key once; each value starts from a copy, so the key schedule (two
     * SHA-256 blocks) is not computed again per value. */
    EVP_MAC_CTX *keyed;
};

ces_mask_t *ces_mask_new(const void *key, size_t key_len) {
    ces_mask_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    if ((m->mac = EVP_MAC_fetch(NULL, "HMAC", NULL)) == NULL ||
        (m->keyed = EVP_MAC_CTX_new(m->mac)) == NULL ||
        EVP_MAC_init(m->keyed, key, key_len, params) != 1) {
        ces_mask_destroy(m);
        return NULL;
    }
    return m;
}

void ces_mask_destroy(ces_mask_t *m) {
    if (m == NULL)
        return;
    EVP_MAC_CTX_free(m->keyed); /* OpenSSL wipes the key it holds */
    EVP_MAC_free(m->mac);
    free(m);
}

int ces_mask_hex(ces_mask_t *m, const void *value, size_t len, char out[CES_MASK_HEX_LEN + 1]) {
    static const char digits[] = "0123456789abcdef";
    unsigned char sum[CES_MASK_HEX_LEN / 2];
    size_t sum_len = 0;
    int rc = -1;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(m->keyed);
    if (ctx == NULL || EVP_MAC_update(ctx, value, len) != 1 ||
        EVP_MAC_final(ctx, sum, &sum_len, sizeof(sum)) != 1 || sum_len != sizeof(sum))
        goto done;
    for (size_t i = 0; i < sum_len; i++) {
        out[2 * i] = digits[sum[i] >> 4];
        out[2 * i + 1] = digits[sum[i] & 15];
    }
    out[CES_MASK_HEX_LEN] = '\0';
    rc = 0;
done:
    EVP_MAC_CTX_free(ctx);
    return rc;
}
