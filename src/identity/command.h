/*
 * command: runs the command that prints a token (`az account get-access-token ...`, a vault's
 * client, a script), bounded in time and output.
 *
 * The command runs as /bin/sh -c COMMAND in a process group of its own, so that a timeout kills
 * whatever it started too; its standard input is /dev/null, and it starts with an empty signal
 * mask and default signal actions whatever the calling thread has (librdkafka's threads block
 * every signal; the daemon ignores SIGPIPE). No descriptor of ces2pg leaks into it: every pipe is
 * made close-on-exec and only its copies on 1 and 2 are inherited.
 */
#ifndef CES_COMMAND_H
#define CES_COMMAND_H

#include <stddef.h>

#include "identity/identity.h"

/* The most a command may print on its standard output. */
#define CES_COMMAND_MAX_OUTPUT (64 * 1024)

/*
 * Runs command with the environment of ces2pg plus env ("NAME=value" entries, NULL-terminated,
 * replacing variables of the same name) for at most timeout_ms. On CES_IDENTITY_OK (it exited 0),
 * *out is its standard output, NUL-terminated, *out_len bytes: owned by the caller, who wipes it
 * (it holds a token). Otherwise CES_IDENTITY_UNAVAILABLE with errstr saying why (it could not
 * start, printed more than CES_COMMAND_MAX_OUTPUT bytes, exited non-zero or on a signal, or was
 * killed at the timeout) and quoting at most the first line of its standard error, escaped; never
 * its standard output. CES_IDENTITY_NOMEM when memory runs out.
 */
ces_identity_err_t ces_command_run(const char *command, const char *const *env, int timeout_ms,
                                   char **out, size_t *out_len, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

#endif
