#include "train/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

static atomic_int first_signal;
static pthread_t watcher;
static int watching;
static sigset_t watched, old_mask;
static struct sigaction old_int, old_term;

/* A second signal: the default action (termination), as if no handler had
 * ever been installed. */
static void die_of(int sig)
{
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
}

static void record(int sig)
{
    int none = 0;
    if (!atomic_compare_exchange_strong(&first_signal, &none, sig)) die_of(sig);
}

static void *watch(void *arg)
{
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&watched, &sig) == 0) record(sig); /* a cancellation point */
    }
    return NULL;
}

int dt_stop_signals_start(void)
{
    atomic_store(&first_signal, 0);
    struct sigaction sa = {0};
    sa.sa_handler = record;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigemptyset(&watched);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &watched, &old_mask);
    watching = pthread_create(&watcher, NULL, watch, NULL) == 0;
    if (!watching) pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    return watching ? 0 : -1;
}

int dt_stop_signals_pending(void) { return atomic_load(&first_signal); }

void dt_stop_signals_end(void)
{
    if (watching) {
        pthread_cancel(watcher);
        pthread_join(watcher, NULL);
        watching = 0;
        /* A signal that arrived after the watcher stopped is still pending
         * here: the old handlers and mask below decide what it does. */
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
}
