#define _GNU_SOURCE
/* The process churn of bench/churn: forks, execs, short-lived processes holding many descriptors,
 * sockets opened, connected and closed, threads, EMFILE, and what it did, counted by itself.
 *
 *   fdt-churn SECONDS RATE    start RATE children a second for SECONDS (at most 64 alive), then
 *                             print its totals as one JSON line; the work is done by a child (its
 *                             pid is "worker" in the JSON), which the first process waits for
 *
 * Every call the kernel's counters see (socket, connect, accept4, close, a thread start) is made
 * through a wrapper that also adds it to totals in a shared memfd mapping, which the children and
 * the programs they exec (this binary again, "exec" mode) write to. Built static (bench/churn
 * does it): no dynamic loader, whose own close() calls would not be counted here. Every process
 * is named fdt-churn (forked ones inherit it, exec'd ones run this binary).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct totals {
    long processes, execs, sockets, socket_errors, connects, connect_errors, accepts, accept_errors, closes,
        close_errors, other_fd_call_errors, threads_started, failed_children;
};

static struct totals *T;
static struct sockaddr_in listener_addr, closed_addr;
#define ADD(field, n) __atomic_add_fetch(&T->field, (n), __ATOMIC_RELAXED)

/* As the kernel's counters judge a failure: would-block answers are none. */
static int failed(long ret) { return ret < 0 && errno != EAGAIN && errno != EINPROGRESS; }

static int c_socket(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ADD(sockets, 1);
    if (failed(fd))
        ADD(socket_errors, 1);
    return fd;
}

static int c_close(int fd)
{
    int ret = close(fd);
    ADD(closes, 1);
    if (failed(ret))
        ADD(close_errors, 1);
    return ret;
}

static int c_connect(int fd, const struct sockaddr_in *to)
{
    int ret = connect(fd, (const struct sockaddr *)to, sizeof(*to));
    ADD(connects, 1);
    if (failed(ret))
        ADD(connect_errors, 1);
    return ret;
}

static int c_open_null(void)
{
    int fd = open("/dev/null", O_RDONLY);
    if (fd < 0)
        ADD(other_fd_call_errors, 1);
    return fd;
}

static int c_thread(pthread_t *thread, void *(*run)(void *), void *arg)
{
    int ret = pthread_create(thread, NULL, run, arg);
    if (ret == 0)
        ADD(threads_started, 1);
    return ret;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A connection to the parent's listener, and one refused by a closed port. */
static void *connect_twice(void *unused)
{
    (void)unused;
    int fd = c_socket();
    if (fd >= 0) {
        c_connect(fd, &listener_addr);
        c_close(fd);
    }
    fd = c_socket();
    if (fd >= 0) {
        c_connect(fd, &closed_addr); /* ECONNREFUSED */
        c_close(fd);
    }
    return NULL;
}

/* Holds 64 sockets and 64 other descriptors, closes half of the sockets, lingers, exits with the
 * rest open (the kernel closes them: no close() call). */
static void holder(int linger_ms)
{
    int fds[64];
    for (int i = 0; i < 64; i++) {
        fds[i] = c_socket();
        c_open_null();
    }
    for (int i = 0; i < 64; i += 2)
        if (fds[i] >= 0)
            c_close(fds[i]);
    nap_ms(linger_ms);
}

/* Runs out of descriptors: under a limit of 24, sockets until socket() fails, then an open(). */
static void exhaust(void)
{
    struct rlimit limit = {24, 24};
    setrlimit(RLIMIT_NOFILE, &limit);
    for (int i = 0; i < 64; i++)
        if (c_socket() < 0)
            break;
    c_open_null();
}

/* Four threads, each connecting twice, then joined. */
static void threads(void)
{
    pthread_t t[4];
    int started = 0;
    for (int i = 0; i < 4; i++)
        if (c_thread(&t[started], connect_twice, NULL) == 0)
            started++;
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}

/* What an exec'd child does, in this binary again ("exec" mode). */
static void exec_child_work(void)
{
    for (int i = 0; i < 8; i++) {
        int fd = c_socket();
        if (fd >= 0)
            c_close(fd);
    }
    c_close(-1); /* EBADF: a failed close */
    threads();
}

static int memfd = -1;
static char self_path[4096];

static void child(long n)
{
    switch (n % 5) {
    case 0:
        holder(20 + (int)(n % 7) * 10);
        break;
    case 1:
        connect_twice(NULL);
        connect_twice(NULL);
        break;
    case 2: {
        char fd_text[16], addr_text[64];
        snprintf(fd_text, sizeof fd_text, "%d", memfd);
        snprintf(addr_text, sizeof addr_text, "%u:%u", (unsigned)ntohs(listener_addr.sin_port),
                 (unsigned)ntohs(closed_addr.sin_port));
        ADD(execs, 1);
        char *argv[] = {"fdt-churn", "exec", fd_text, addr_text, NULL};
        execv(self_path, argv); /* by its own name: the task name after exec is the file's */
        ADD(execs, -1);
        _exit(3);
    }
    case 3:
        exhaust();
        break;
    default:
        threads();
        break;
    }
}

static volatile int stopping;
static int listen_fd = -1;

static void *acceptor(void *unused)
{
    (void)unused;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* no signal restarts its accept4 (a second, failed call) */
    while (1) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        ADD(accepts, 1);
        if (failed(fd)) {
            ADD(accept_errors, 1);
            continue;
        }
        c_close(fd);
        if (stopping)
            return NULL;
    }
}

static void map_totals(int fd)
{
    T = mmap(NULL, sizeof(struct totals), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (T == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
}

static void reap(int block, int *alive)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
        (*alive)--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            ADD(failed_children, 1);
        if (block && *alive == 0)
            break;
    }
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "exec") == 0) {
        unsigned listen_port, closed_port;
        map_totals(atoi(argv[2]));
        if (sscanf(argv[3], "%u:%u", &listen_port, &closed_port) != 2)
            return 2;
        listener_addr.sin_family = closed_addr.sin_family = AF_INET;
        listener_addr.sin_addr.s_addr = closed_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        listener_addr.sin_port = htons(listen_port);
        closed_addr.sin_port = htons(closed_port);
        exec_child_work();
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: fdt-churn SECONDS RATE\n");
        return 2;
    }
    double seconds = atof(argv[1]), rate = atof(argv[2]);
    memfd = memfd_create("fdt-churn-totals", 0); /* inherited across exec: no MFD_CLOEXEC */
    if (memfd < 0 || ftruncate(memfd, sizeof(struct totals)) != 0) {
        perror("memfd");
        return 2;
    }
    map_totals(memfd);
    /* The work runs in a child: this process's instance also holds what its starter did between its
     * fork and its exec (Python's subprocess closes pipe ends), which this program cannot count. */
    pid_t worker = fork();
    if (worker < 0) {
        perror("fork");
        return 2;
    }
    if (worker > 0) {
        int status;
        if (waitpid(worker, &status, 0) != worker || !WIFEXITED(status))
            return 2;
        return WEXITSTATUS(status);
    }
    ssize_t n_path = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n_path <= 0) {
        perror("readlink");
        return 2;
    }
    self_path[n_path] = 0;

    /* A port nothing listens on: bound by a socket that never listens (so nobody can take it). */
    int closed = c_socket();
    closed_addr.sin_family = AF_INET;
    closed_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof closed_addr;
    if (bind(closed, (struct sockaddr *)&closed_addr, sizeof closed_addr) != 0 ||
        getsockname(closed, (struct sockaddr *)&closed_addr, &len) != 0) {
        perror("bind");
        return 2;
    }
    listen_fd = c_socket();
    listener_addr = closed_addr;
    listener_addr.sin_port = 0;
    len = sizeof listener_addr;
    if (bind(listen_fd, (struct sockaddr *)&listener_addr, sizeof listener_addr) != 0 ||
        listen(listen_fd, 4096) != 0 || getsockname(listen_fd, (struct sockaddr *)&listener_addr, &len) != 0) {
        perror("listen");
        return 2;
    }
    pthread_t accepting;
    if (c_thread(&accepting, acceptor, NULL) != 0)
        return 2;

    double start = now(), end = start + seconds, next = start;
    long n = 0;
    int alive = 0;
    while (now() < end) {
        reap(0, &alive);
        if (alive >= 64) {
            nap_ms(1);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            child(n);
            _exit(0);
        }
        if (pid > 0) {
            ADD(processes, 1);
            alive++;
        }
        n++;
        next += 1.0 / rate;
        double wait = next - now();
        if (wait > 0)
            nap_ms((int)(wait * 1000));
    }
    if (alive)
        reap(1, &alive);
    stopping = 1;
    int wake = c_socket(); /* the acceptor takes one more connection, sees stopping and ends */
    c_connect(wake, &listener_addr);
    pthread_join(accepting, NULL);
    c_close(wake);
    c_close(listen_fd);
    c_close(closed);
    printf("{\"worker\": %d, \"seconds\": %.1f, \"processes\": %ld, \"execs\": %ld, \"failed_children\": %ld, \"sockets\": %ld, "
           "\"socket_errors\": %ld, \"connects\": %ld, \"connect_errors\": %ld, \"accepts\": %ld, "
           "\"accept_errors\": %ld, \"closes\": %ld, \"close_errors\": %ld, \"other_fd_call_errors\": %ld, "
           "\"threads_started\": %ld}\n",
           (int)getpid(), now() - start, T->processes, T->execs, T->failed_children, T->sockets, T->socket_errors, T->connects,
           T->connect_errors, T->accepts, T->accept_errors, T->closes, T->close_errors, T->other_fd_call_errors,
           T->threads_started);
    return T->failed_children ? 1 : 0;
}
