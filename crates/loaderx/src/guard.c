/*
 * A memcpy that survives SIGBUS: the copy out of a memory-mapped file that
 * another process cut short (or whose device failed) returns -1 instead of
 * killing the process.
 *
 * The SIGBUS handler jumps back into loaderx_guarded_copy when the faulting
 * thread is inside one (a thread-local marks it); every other SIGBUS goes to
 * the handler that was installed before ours, or to the default action, so
 * faults elsewhere in the process behave as they would without loaderx.
 * Only C frames (memcpy) lie between the handler and the jump target.
 */
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>

static struct sigaction previous;
static __thread sigjmp_buf *volatile active;

static void on_bus(int sig, siginfo_t *info, void *context) {
    sigjmp_buf *jump = active;
    if (jump != NULL) {
        active = NULL;
        siglongjmp(*jump, 1);
    }
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction != NULL) {
            previous.sa_sigaction(sig, info, context);
            return;
        }
    } else if (previous.sa_handler == SIG_IGN) {
        return;
    } else if (previous.sa_handler != SIG_DFL) {
        previous.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Installs the handler (once per process; the caller serialises). */
int loaderx_install_bus_guard(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus;
    /* SA_NODEFER: SIGBUS stays unblocked after the jump, so sigsetjmp need
       not save the signal mask (no system call per copy). */
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGBUS, &action, &previous);
}

/* Copies n bytes; 0 on success, -1 when the source faulted (SIGBUS). */
int loaderx_guarded_copy(void *dst, const void *src, size_t n) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 0) != 0) {
        return -1;
    }
    active = &jump;
    memcpy(dst, src, n);
    active = NULL;
    return 0;
}
