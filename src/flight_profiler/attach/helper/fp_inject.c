/* fp_inject: start a detached native thread that takes the GIL itself and runs a Python string.
 *
 * gdb dlopen()s this library in a target whose main thread is parked in a syscall without the
 * GIL, calls fp_inject_start(code) and returns at once: the new thread, not gdb, waits for the
 * GIL, so gdb never blocks on it (see docs/attach.md). No Python headers: the few C-API entry
 * points are looked up with dlsym(RTLD_DEFAULT), so one build serves CPython 3.9-3.14, shared
 * libpython and statically linked interpreters alike.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef int (*int_void_fn)(void);
typedef int (*gil_ensure_fn)(void);
typedef void (*gil_release_fn)(int);
typedef int (*run_string_fn)(const char *);
typedef int (*run_string_flags_fn)(const char *, void *);

static void *fp_run(void *arg) {
    char *code = (char *)arg;
    int_void_fn is_initialized = (int_void_fn)dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    gil_ensure_fn ensure = (gil_ensure_fn)dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    gil_release_fn release = (gil_release_fn)dlsym(RTLD_DEFAULT, "PyGILState_Release");
    run_string_fn run = (run_string_fn)dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    run_string_flags_fn run_flags =
        (run_string_flags_fn)dlsym(RTLD_DEFAULT, "PyRun_SimpleStringFlags");
    /* Never touch an interpreter that is not (or no longer) running: PyGILState_Ensure during
     * finalization would hang or end this thread in the middle of nowhere. */
    if (is_initialized && ensure && release && (run || run_flags) && is_initialized()) {
        int state = ensure();
        if (run)
            run(code);
        else
            run_flags(code, NULL);
        release(state);
    }
    free(code);
    return NULL;
}

/* Returns 0 when the thread was started, a negative number otherwise. */
__attribute__((visibility("default"))) int fp_inject_start(const char *code) {
    pthread_t thread;
    pthread_attr_t attr;
    char *copy;
    int rc;

    if (code == NULL)
        return -1;
    copy = strdup(code);
    if (copy == NULL)
        return -2;
    if (pthread_attr_init(&attr) != 0) {
        free(copy);
        return -3;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&thread, &attr, fp_run, copy);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(copy);
        return -4;
    }
    return 0;
}
