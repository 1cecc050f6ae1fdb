/* Masked columns: the keyed hash itself (RFC 4231's vectors), and a rule's masks made on an
 * event (columns.h): hash and null, NULL kept, the column retyped to text, a masked key refused. */
#include "test_util.h"

#include "apply/columns.h"
#include "apply/mask.h"

/* RFC 4231, test cases 1 and 2 (HMAC-SHA-256). */
static void rfc4231_vectors(void **state) {
    (void)state;
    char out[CES_MASK_HEX_LEN + 1];
    unsigned char key1[20];
    memset(key1, 0x0b, sizeof(key1));
    ces_mask_t *m = ces_mask_new(key1, sizeof(key1));
    assert_non_null(m);
    assert_int_equal(ces_mask_hex(m, "Hi There", 8, out), 0);
    assert_string_equal(out, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    ces_mask_destroy(m);

    m = ces_mask_new("Jefe", 4);
    assert_non_null(m);
    /* Twice: each value starts from the keyed state, not from the last value's. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ces_mask_hex(m, "what do ya want for nothing?", 28, out), 0);
        assert_string_equal(out,
                            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }
    ces_mask_destroy(m);
    ces_mask_destroy(NULL);
}

static const char *const mask_columns[] = {"EMail", "Notes", "ID"};
static const char *const masks[] = {"hash", "null", "hash"};

static ces_event_t masked_event(ces_field_t *pkkey, ces_field_t *current, ces_field_t *old) {
    static ces_column_t cols[3];
    cols[0] = (ces_column_t)TEST_COLUMN("ID", "int");
    cols[1] = (ces_column_t)TEST_COLUMN("Email", "nvarchar(200)");
    cols[2] = (ces_column_t)TEST_COLUMN("Notes", "nvarchar(max)");
    pkkey[0] = (ces_field_t)TEST_FIELD("ID", "7", 1, false);
    current[0] = (ces_field_t)TEST_FIELD("ID", "7", 1, false);
    current[1] = (ces_field_t)TEST_FIELD("Email", "a@example.com", 13, false);
    current[2] = (ces_field_t)TEST_FIELD("Notes", "private", 7, false);
    old[0] = (ces_field_t)TEST_FIELD("ID", "7", 1, false);
    old[1] = (ces_field_t)TEST_FIELD("Email", NULL, 0, true);
    return (ces_event_t){.op = CES_OP_UPDATE, .db = "Sales", .schema = "dbo", .table = "People",
                         .cols = cols, .ncols = 3, .pkkey = pkkey, .npkkey = 1,
                         .current = current, .ncurrent = 3, .old = old, .nold = 2};
}

static void masks_on_an_event(void **state) {
    (void)state;
    ces_field_t pkkey[1], current[3], old[2];
    ces_event_t ev = masked_event(pkkey, current, old);
    ces_mask_t *hasher = ces_mask_new("a key of sixteen+", 17);
    ces_arena_t *arena = ces_arena_new();
    assert_non_null(hasher);
    assert_non_null(arena);
    /* Email and Notes masked; the key column is not in this rule. */
    ces_columns_rule_t rule = {.mask_columns = mask_columns, .masks = masks, .nmasks = 2,
                               .hasher = hasher};
    assert_true(ces_columns_any(&rule));
    const char *column = NULL;
    assert_int_equal(ces_columns_apply(&rule, &ev, true, arena, &column), CES_COLUMNS_OK);

    char want[CES_MASK_HEX_LEN + 1];
    assert_int_equal(ces_mask_hex(hasher, "a@example.com", 13, want), 0);
    assert_string_equal(ev.cols[1].type, "ces2pg:text"); /* a hash is text whatever the source's */
    assert_string_equal(ev.cols[2].type, "nvarchar(max)"); /* NULL fits the mapped type */
    assert_string_equal(ev.current[0].value, "7");
    assert_string_equal(ev.current[1].value, want);
    assert_int_equal(ev.current[1].value_len, CES_MASK_HEX_LEN);
    assert_true(ev.current[2].is_null);
    assert_null(ev.current[2].value);
    assert_true(ev.old[1].is_null); /* NULL stays NULL: no hash of nothing */

    ces_mask_destroy(hasher);
    ces_arena_destroy(arena);
}

static void a_masked_key_is_refused(void **state) {
    (void)state;
    ces_field_t pkkey[1], current[3], old[2];
    ces_event_t ev = masked_event(pkkey, current, old);
    ces_mask_t *hasher = ces_mask_new("a key of sixteen+", 17);
    ces_arena_t *arena = ces_arena_new();
    ces_columns_rule_t rule = {.mask_columns = mask_columns, .masks = masks, .nmasks = 3,
                               .hasher = hasher};
    const char *column = NULL;
    assert_int_equal(ces_columns_apply(&rule, &ev, true, arena, &column), CES_COLUMNS_KEY_MASKED);
    assert_string_equal(column, "ID");
    /* A history alone needs no key: the key is masked like any column. */
    assert_int_equal(ces_columns_apply(&rule, &ev, false, arena, &column), CES_COLUMNS_OK);
    assert_int_equal(strlen(ev.pkkey[0].value), CES_MASK_HEX_LEN);
    ces_mask_destroy(hasher);
    ces_arena_destroy(arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rfc4231_vectors),
        cmocka_unit_test(masks_on_an_event),
        cmocka_unit_test(a_masked_key_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
