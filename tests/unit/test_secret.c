#include "test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/secret.h"

/* Secrets: read from a file without surrounding blanks, never quoted; Event Hubs connection
 * strings taken apart. */
static void secrets_are_read_and_taken_apart(void **state) {
    (void)state;
    char file[] = "/tmp/ces2pg-secret-XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "  hunter2\n", 10), 10);
    close(fd);
    char err[256];
    char *secret = ces_secret_read_file("c.conf", 7, "postgres.password_file", file, err,
                                        sizeof(err));
    assert_non_null(secret);
    assert_string_equal(secret, "hunter2");
    free(secret);
    fd = open(file, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, " \n", 2), 2);
    close(fd);
    assert_null(ces_secret_read_file("c.conf", 7, "postgres.password_file", file, err,
                                     sizeof(err)));
    assert_non_null(strstr(err, "c.conf:7: postgres.password_file: "));
    assert_non_null(strstr(err, "is empty"));
    unlink(file);
    assert_null(ces_secret_read_file("c.conf", 7, "k", file, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot read"));

    assert_true(ces_secret_one_line("a b;c=d"));
    assert_false(ces_secret_one_line("a\nb"));

    const char *conn = "Endpoint=sb://ns1.servicebus.windows.net/;SharedAccessKeyName=listen;"
                       "SharedAccessKey=c2VjcmV0LWtleQ==";
    char host[64];
    assert_int_equal(ces_secret_eventhubs_host(conn, host, sizeof(host)), 0);
    assert_string_equal(host, "ns1.servicebus.windows.net");
    assert_int_equal(ces_secret_eventhubs_host("SharedAccessKey=x", host, sizeof(host)), -1);
    assert_int_equal(ces_secret_eventhubs_host("endpoint=sb://a b/", host, sizeof(host)), -1);
    char *key = ces_secret_shared_access_key(conn);
    assert_non_null(key);
    assert_string_equal(key, "c2VjcmV0LWtleQ==");
    free(key);
    /* Too short to redact without garbling the log. */
    assert_null(ces_secret_shared_access_key("Endpoint=sb://h/;SharedAccessKey=short"));
}

/* A secret file others may read is refused with the fix; root-owned 0640 is allowed. */
static void loose_secret_files_are_refused(void **state) {
    (void)state;
    char file[] = "/tmp/ces2pg-secret-XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hunter2\n", 8), 8);
    close(fd);
    char err[512];
    assert_int_equal(chmod(file, 0644), 0);
    assert_null(ces_secret_read_file("c.conf", 3, "postgres.password_file", file, err,
                                     sizeof(err)));
    assert_non_null(strstr(err, "c.conf:3: postgres.password_file: "));
    assert_non_null(strstr(err, "readable by its group or others (mode 0644)"));
    assert_non_null(strstr(err, "chmod 600"));
    assert_null(strstr(err, "hunter2"));
    assert_int_equal(chmod(file, 0600), 0);
    char *secret = ces_secret_read_file("c.conf", 3, "k", file, err, sizeof(err));
    assert_non_null(secret);
    free(secret);
    unlink(file);

    struct stat st = {.st_mode = S_IFREG | 0640, .st_uid = 0};
    assert_true(ces_secret_private(&st));
    st.st_uid = 1000;
    assert_false(ces_secret_private(&st));
    st.st_mode = S_IFREG | 0400;
    assert_true(ces_secret_private(&st));
    st.st_uid = 0;
    st.st_mode = S_IFREG | 0604;
    assert_false(ces_secret_private(&st));
    st.st_mode = S_IFREG | 0660;
    assert_false(ces_secret_private(&st));
}

/* Which text in a configuration file is a secret itself, not a reference to one. */
static void literal_secrets_are_recognised(void **state) {
    (void)state;
    assert_true(ces_secret_conninfo_literal("host=db password=hunter2 user=x"));
    assert_true(ces_secret_conninfo_literal("password = 'a b'"));
    assert_false(ces_secret_conninfo_literal("host=db password=${PGPASS}"));
    assert_false(ces_secret_conninfo_literal("host=db user=x"));
    assert_false(ces_secret_conninfo_literal("host=db passfile=/p"));
    assert_true(ces_secret_conninfo_literal("postgresql://u:pw@h/db"));
    assert_true(ces_secret_conninfo_literal("postgres://h/db?user=u&password=pw"));
    assert_false(ces_secret_conninfo_literal("postgresql://u@h:5432/db"));
    assert_false(ces_secret_conninfo_literal("postgresql://u:${P}@h/db"));
    assert_true(ces_secret_connection_string_literal(
        "Endpoint=sb://n/;SharedAccessKeyName=r;SharedAccessKey=abc="));
    assert_false(ces_secret_connection_string_literal(
        "Endpoint=sb://n/;SharedAccessKeyName=r;SharedAccessKey=${KEY}"));
    assert_false(ces_secret_connection_string_literal("Endpoint=sb://n/;SharedAccessKeyName=r"));
    assert_true(ces_secret_property_literal("sasl.password=x"));
    assert_true(ces_secret_property_literal("ssl.key.password=x"));
    assert_false(ces_secret_property_literal("sasl.password=${P}"));
    assert_false(ces_secret_property_literal("ssl.key.location=/k.pem"));
    assert_false(ces_secret_property_literal("fetch.wait.max.ms=50"));
    assert_true(ces_secret_property_name("ssl.key.location", 16));
    assert_false(ces_secret_property_name("fetch.wait.max.ms", 17));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(secrets_are_read_and_taken_apart),
        cmocka_unit_test(loose_secret_files_are_refused),
        cmocka_unit_test(literal_secrets_are_recognised),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
