#include "identity/command.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

extern char **environ;

/* How much of the standard error is kept for the message: its first line is quoted. */
#define STDERR_KEEP 512

/* What a running command has said so far. */
typedef struct {
    pid_t pid;
    int out_fd, err_fd; /* -1 once at end of file */
    char *out;          /* CES_COMMAND_MAX_OUTPUT + 1 bytes, never reallocated */
    size_t out_len;
    bool too_much;
    char err[STDERR_KEEP + 1];
    size_t err_len;
} run_t;

/* ces2pg's environment without the names env sets, then env. A new array of borrowed strings
 * (free the array only), or NULL. */
static char **make_environment(const char *const *env) {
    size_t n = 0, extra = 0;
    while (environ != NULL && environ[n] != NULL)
        n++;
    while (env[extra] != NULL)
        extra++;
    char **envp = malloc((n + extra + 1) * sizeof(*envp));
    if (envp == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool replaced = false;
        for (size_t j = 0; j < extra && !replaced; j++) {
            size_t name = strcspn(env[j], "=") + 1;
            replaced = strncmp(environ[i], env[j], name) == 0;
        }
        if (!replaced)
            envp[k++] = environ[i];
    }
    for (size_t j = 0; j < extra; j++)
        envp[k++] = (char *)env[j];
    envp[k] = NULL;
    return envp;
}

/* Starts /bin/sh -c command with its standard output and error on pipes. Returns 0, or an errno. */
static int start(run_t *r, const char *command, char **envp) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    bool fa_made = false, attr_made = false;
    int rc = 0;
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        rc = errno;
        goto done;
    }
    rc = posix_spawn_file_actions_init(&fa);
    fa_made = rc == 0;
    if (rc == 0)
        rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    if (rc == 0)
        rc = posix_spawnattr_init(&attr);
    attr_made = fa_made && rc == 0;
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    static const int reset[] = {SIGPIPE, SIGHUP, SIGINT, SIGQUIT, SIGTERM,
                                SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM};
    for (size_t i = 0; i < sizeof(reset) / sizeof(reset[0]); i++)
        sigaddset(&defaults, reset[i]);
    if (rc == 0)
        rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                 POSIX_SPAWN_SETSIGDEF);
    if (rc == 0)
        rc = posix_spawnattr_setpgroup(&attr, 0);
    if (rc == 0)
        rc = posix_spawnattr_setsigmask(&attr, &none);
    if (rc == 0)
        rc = posix_spawnattr_setsigdefault(&attr, &defaults);
    char *argv[] = {"sh", "-c", (char *)command, NULL};
    if (rc == 0)
        rc = posix_spawn(&r->pid, "/bin/sh", &fa, &attr, argv, envp);
done:
    if (attr_made)
        posix_spawnattr_destroy(&attr);
    if (fa_made)
        posix_spawn_file_actions_destroy(&fa);
    /* The child has its copies; ours would hide its end of file. */
    if (out[1] >= 0)
        close(out[1]);
    if (err[1] >= 0)
        close(err[1]);
    if (rc != 0) {
        if (out[0] >= 0)
            close(out[0]);
        if (err[0] >= 0)
            close(err[0]);
        out[0] = err[0] = -1;
    }
    r->out_fd = out[0];
    r->err_fd = err[0];
    return rc;
}

/* Reads what is there on fd; closes it at end of file. */
static void drain(run_t *r, int *fd, bool is_out) {
    char scratch[4096];
    char *dst = is_out ? r->out + r->out_len : scratch;
    size_t room = is_out ? CES_COMMAND_MAX_OUTPUT + 1 - r->out_len : sizeof(scratch);
    ssize_t n = read(*fd, dst, room);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close(*fd);
        *fd = -1;
        return;
    }
    if (is_out) {
        r->out_len += (size_t)n;
        r->too_much = r->out_len > CES_COMMAND_MAX_OUTPUT;
        return;
    }
    size_t keep = STDERR_KEEP - r->err_len < (size_t)n ? STDERR_KEEP - r->err_len : (size_t)n;
    memcpy(r->err + r->err_len, scratch, keep);
    r->err_len += keep;
    explicit_bzero(scratch, sizeof(scratch));
}

/* Reads both pipes until they close, the output grows too big, or deadline (monotonic ms).
 * Returns false at the deadline. */
static bool read_until_closed(run_t *r, int64_t deadline) {
    while ((r->out_fd >= 0 || r->err_fd >= 0) && !r->too_much) {
        int64_t left = deadline - ces_clock_now_ms();
        if (left <= 0)
            return false;
        struct pollfd p[2] = {{r->out_fd, POLLIN, 0}, {r->err_fd, POLLIN, 0}};
        int n = poll(p, 2, (int)left);
        if (n < 0 && errno != EINTR)
            return false;
        if (n <= 0)
            continue;
        if (p[0].revents != 0)
            drain(r, &r->out_fd, true);
        if (p[1].revents != 0)
            drain(r, &r->err_fd, false);
    }
    return true;
}

/* Waits for the command's exit until deadline. Returns true with *status set, or false. The
 * pipes are closed by now, so an exit is near; a short poll keeps this free of SIGCHLD, which
 * belongs to the daemon. */
static bool wait_exit(pid_t pid, int64_t deadline, int *status) {
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid)
            return true;
        if (w < 0 && errno != EINTR)
            return false;
        int64_t left = deadline - ces_clock_now_ms();
        if (left <= 0)
            return false;
        poll(NULL, 0, left < 10 ? (int)left : 10);
    }
}

/* The first line of the command's standard error, escaped, into msg ("" when it said nothing). */
static void first_stderr_line(const run_t *r, char *msg, size_t msg_size) {
    size_t n = 0;
    while (n < r->err_len && r->err[n] != '\n')
        n++;
    if (n > 200)
        n = 200;
    msg[0] = '\0';
    if (n > 0) {
        snprintf(msg, msg_size, ": ");
        ces_log_escape(msg + 2, msg_size - 2, r->err, n);
    }
}

/* Says in errstr how a finished command failed. */
static void explain(const run_t *r, int status, bool finished, int timeout_ms, char *errstr,
                    size_t errstr_size) {
    char said[CES_LOG_ESCAPED_SIZE(200) + 2];
    first_stderr_line(r, said, sizeof(said));
    if (r->too_much)
        snprintf(errstr, errstr_size, "the command printed more than %d KiB and was killed",
                 CES_COMMAND_MAX_OUTPUT / 1024);
    else if (!finished)
        snprintf(errstr, errstr_size, "the command did not finish within %d ms and was killed%s",
                 timeout_ms, said);
    else if (WIFEXITED(status))
        snprintf(errstr, errstr_size, "the command exited with status %d%s", WEXITSTATUS(status),
                 said);
    else
        snprintf(errstr, errstr_size, "the command was killed by signal %d%s",
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0, said);
}

ces_identity_err_t ces_command_run(const char *command, const char *const *env, int timeout_ms,
                                   char **out, size_t *out_len, char *errstr, size_t errstr_size) {
    ces_identity_err_t err = CES_IDENTITY_NOMEM;
    run_t r = {.pid = -1, .out_fd = -1, .err_fd = -1};
    char **envp = make_environment(env);
    r.out = malloc(CES_COMMAND_MAX_OUTPUT + 1);
    *out = NULL;
    *out_len = 0;
    if (envp == NULL || r.out == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        goto done;
    }
    int64_t deadline = ces_clock_now_ms() + timeout_ms;
    int rc = start(&r, command, envp);
    err = CES_IDENTITY_UNAVAILABLE;
    if (rc != 0) {
        snprintf(errstr, errstr_size, "cannot run /bin/sh: %s", strerror(rc));
        goto done;
    }
    int status = 0;
    bool finished = read_until_closed(&r, deadline) && !r.too_much &&
                    wait_exit(r.pid, deadline, &status);
    if (!finished) {
        kill(-r.pid, SIGKILL);
        while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    if (!finished || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        explain(&r, status, finished, timeout_ms, errstr, errstr_size);
        goto done;
    }
    r.out[r.out_len] = '\0';
    *out = r.out;
    *out_len = r.out_len;
    r.out = NULL;
    err = CES_IDENTITY_OK;
done:
    if (r.out_fd >= 0)
        close(r.out_fd);
    if (r.err_fd >= 0)
        close(r.err_fd);
    if (r.out != NULL) {
        explicit_bzero(r.out, r.out_len);
        free(r.out);
    }
    free(envp);
    return err;
}
