#define _GNU_SOURCE
/* Syscall-heavy workloads for bench/overhead: prints iterations per second.
 *   workload socket SECONDS   socket() + close() in a loop
 *   workload accept SECONDS   loopback connect() + accept4() + two close() in a loop
 *   workload badclose SECONDS [RATE]
 *                             close(-1) in a loop, the cheapest traced call (one event, EBADF),
 *                             at most RATE calls per second when RATE is given
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    double seconds = atof(argv[2]);
    long iterations = 0;
    double start = now(), end = start + seconds;
    if (strcmp(argv[1], "socket") == 0) {
        do {
            for (int i = 0; i < 256; i++)
                close(socket(AF_INET, SOCK_STREAM, 0));
            iterations += 256;
        } while (now() < end);
    } else if (strcmp(argv[1], "badclose") == 0) {
        double rate = argc > 3 ? atof(argv[3]) : 0;
        double t;
        do {
            for (int i = 0; i < 1024; i++)
                close(-1);
            iterations += 1024;
            t = now();
            if (rate > 0 && start + iterations / rate > t) {
                double wait = start + iterations / rate - t;
                struct timespec pause = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (time_t)wait) * 1e9)};
                nanosleep(&pause, NULL);
            }
        } while (t < end);
    } else {
        int listener = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(addr);
        if (bind(listener, (struct sockaddr *)&addr, sizeof(addr)) || listen(listener, 128) ||
            getsockname(listener, (struct sockaddr *)&addr, &len))
            return 1;
        do {
            for (int i = 0; i < 64; i++) {
                int client = socket(AF_INET, SOCK_STREAM, 0);
                struct linger nolinger = {.l_onoff = 1, .l_linger = 0};
                setsockopt(client, SOL_SOCKET, SO_LINGER, &nolinger, sizeof(nolinger));
                if (connect(client, (struct sockaddr *)&addr, sizeof(addr)))
                    return 1;
                close(accept4(listener, NULL, NULL, 0));
                close(client);
            }
            iterations += 64;
        } while (now() < end);
    }
    printf("%.0f\n", iterations / (now() - start));
    return 0;
}
