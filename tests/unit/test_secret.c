#include "test_util.h"

#include <fcntl.h>
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(secrets_are_read_and_taken_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
