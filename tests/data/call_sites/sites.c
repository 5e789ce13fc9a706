/* Test program of fdtrace's --stacks: each mode makes descriptors or threads in a function of a
 * known name, once it has read a byte from stdin (so the tracer is attached by then), prints a
 * line when done, and waits for end of file on stdin before it exits. Built with frame pointers. */
#define _GNU_SOURCE
#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void wait_byte(void)
{
    char c;
    if (read(0, &c, 1) != 1)
        exit(3);
}

static void wait_eof(void)
{
    char c;
    while (read(0, &c, 1) == 1)
        ;
}

__attribute__((noinline)) static void leak_sockets(int n)
{
    for (int i = 0; i < n; i++)
        socket(AF_INET, SOCK_STREAM, 0);
}

__attribute__((noinline)) static void balanced_sockets(int n)
{
    for (int i = 0; i < n; i++)
        close(socket(AF_INET, SOCK_STREAM, 0));
}

/* Fills the stack below its caller's frame with its own return address: a word right after a
 * call, in this binary, which the frames of the libc wrappers called next leave in place where they
 * do not write. A caller found among them would be the wrong one (decoy, not the wrapper's). */
__attribute__((noinline)) static void leave_return_addresses(void)
{
    void *volatile words[64];
    for (int i = 0; i < 64; i++)
        words[i] = __builtin_return_address(0);
}

__attribute__((noinline)) static void decoy(void)
{
    leave_return_addresses();
}

__attribute__((noinline)) static void exhaust_descriptors(int *made, int *failed)
{
    decoy();
    for (;;) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0) {
            if (errno == EMFILE)
                (*failed)++;
            break;
        }
        (*made)++;
    }
    for (int i = 0; i < 3; i++) {
        decoy();
        if (open("/dev/null", O_RDONLY) < 0 && errno == EMFILE)
            (*failed)++;
    }
}

__attribute__((noinline)) static void open_before_exec(void)
{
    for (int i = 0; i < 3; i++)
        socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    for (int i = 0; i < 2; i++)
        socket(AF_INET, SOCK_STREAM, 0);
}

__attribute__((noinline)) static void open_then_close_range(void)
{
    int first = socket(AF_INET, SOCK_STREAM, 0);
    for (int i = 0; i < 3; i++)
        socket(AF_INET, SOCK_STREAM, 0);
    syscall(SYS_close_range, first, ~0U, 0);
}

__attribute__((noinline)) static void child_work(void)
{
    for (int i = 0; i < 3; i++)
        socket(AF_INET, SOCK_STREAM, 0);
}

__attribute__((noinline)) static void before_fork(void)
{
    int a = socket(AF_INET, SOCK_STREAM, 0), b = socket(AF_INET, SOCK_STREAM, 0);
    pid_t child = fork();
    if (child == 0) {
        child_work();
        _exit(0); /* its three sockets are closed by its exit, without close() */
    }
    waitpid(child, NULL, 0);
    close(a);
    close(b);
}

static int block_pipe[2];

static void *blocked_worker(void *arg)
{
    char c;
    (void)arg;
    read(block_pipe[0], &c, 1);
    return NULL;
}

__attribute__((noinline)) static void spawn_workers(int n)
{
    pthread_t t;
    for (int i = 0; i < n; i++)
        pthread_create(&t, NULL, blocked_worker, NULL);
}

/* Two functions that make descriptors the same way, reached from one indirect call: their sites
 * differ only in the wrapper's caller, which no frame pointer names. */
__attribute__((noinline)) static void first_maker(int n, int use_open)
{
    for (int i = 0; i < n; i++) {
        if (use_open)
            open("/dev/null", O_RDONLY);
        else
            socket(AF_INET, SOCK_STREAM, 0);
    }
}

__attribute__((noinline)) static void second_maker(int n, int use_open)
{
    for (int i = 0; i < n; i++) {
        if (use_open)
            open("/dev/null", O_RDONLY);
        else
            socket(AF_INET, SOCK_STREAM, 0);
    }
}

__attribute__((noinline)) static void dispatch(void (*maker)(int, int), int n, int use_open)
{
    maker(n, use_open);
}

static void *idle_thread(void *arg)
{
    (void)arg;
    pause();
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "after-exec") == 0) {
        printf("exec'd\n");
        fflush(stdout);
        wait_eof();
        return 0;
    }
    wait_byte();
    if (strcmp(mode, "leak") == 0) {
        leak_sockets(atoi(argv[2]));
        balanced_sockets(atoi(argv[3]));
        printf("done\n");
    } else if (strcmp(mode, "indirect") == 0) {
        /* indirect N socket|open single|threaded */
        int use_open = strcmp(argv[3], "open") == 0;
        if (strcmp(argv[4], "threaded") == 0) {
            pthread_t idle; /* a second thread: libc's cancellable wrappers take their slow path */
            pthread_create(&idle, NULL, idle_thread, NULL);
        }
        void (*makers[2])(int, int) = {first_maker, second_maker};
        for (int k = 0; k < 2; k++)
            dispatch(makers[k], atoi(argv[2]), use_open);
        printf("done\n");
    } else if (strcmp(mode, "libraries") == 0) {
        /* libraries N LIB...: each library's make_sockets(N), through one indirect call */
        int n = atoi(argv[2]);
        for (int k = 3; k < argc; k++) {
            void *library = dlopen(argv[k], RTLD_NOW | RTLD_LOCAL);
            void (*make)(int) = library ? (void (*)(int))dlsym(library, "make_sockets") : NULL;
            if (!make)
                return 6;
            make(n);
        }
        printf("done\n");
    } else if (strcmp(mode, "emfile") == 0) {
        int made = 0, failed = 0;
        exhaust_descriptors(&made, &failed);
        printf("made=%d failed=%d\n", made, failed);
    } else if (strcmp(mode, "exec") == 0) {
        open_before_exec();
        printf("opened\n");
        fflush(stdout);
        sleep(2); /* the tracer reads the stacks while this program's addresses are its own */
        execl("/proc/self/exe", argv[0], "after-exec", (char *)NULL);
        return 4;
    } else if (strcmp(mode, "close_range") == 0) {
        open_then_close_range();
        printf("done\n");
    } else if (strcmp(mode, "fork") == 0) {
        before_fork();
        printf("done\n");
    } else if (strcmp(mode, "threads") == 0) {
        if (pipe(block_pipe) != 0)
            return 5;
        spawn_workers(atoi(argv[2]));
        printf("started\n");
    } else {
        return 2;
    }
    fflush(stdout);
    wait_eof();
    return 0;
}
