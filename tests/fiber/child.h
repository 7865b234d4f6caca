/*
 * child.h - run a test body in a forked child and capture how it died.
 *
 * For behaviour that ends the process (a stack overflow, a broken canary):
 * the child runs fn with stderr on a pipe and core dumps off; the parent
 * collects the wait status and what the child wrote.
 */
#ifndef WEFT_TESTS_FIBER_CHILD_H
#define WEFT_TESTS_FIBER_CHILD_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct child_result {
    int status;     /* as from waitpid */
    char err[4096]; /* the child's stderr, NUL-terminated, truncated */
} child_result;

static inline bool child_run(void (*fn)(void), child_result *r)
{
    struct rlimit no_core = {0, 0};
    int fds[2];
    size_t len = 0;
    ssize_t n;
    pid_t pid;

    memset(r, 0, sizeof *r);
    if (pipe(fds) != 0)
        return false;
    fflush(NULL);
    pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        /* cmocka catches these during a test and would longjmp the child
         * back into the test runner; the child must die of them instead. */
        static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

        for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
            signal(fatal[i], SIG_DFL);
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    for (;;) {
        char sink[512];

        /* Keep reading past a full buffer, or the child could block. */
        if (len < sizeof r->err - 1)
            n = read(fds[0], r->err + len, sizeof r->err - 1 - len);
        else
            n = read(fds[0], sink, sizeof sink);
        if (n <= 0)
            break;
        if (len < sizeof r->err - 1)
            len += (size_t)n;
    }
    close(fds[0]);
    r->err[len] = '\0';
    return waitpid(pid, &r->status, 0) == pid;
}

static inline bool child_killed_by(const child_result *r, int sig)
{
    return WIFSIGNALED(r->status) && WTERMSIG(r->status) == sig;
}

#endif
