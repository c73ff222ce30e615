/* Time and sizes: what kvxfer-bench and its reference tools (bench/ref/)
 * share. Depends on libc only, so the reference lines link no kvxfer. */
#define _GNU_SOURCE
#include "units.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double now_s(void)
{
    return (double)now_ns() / 1e9;
}

void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || end == s)
        return -1;
    *out = v;
    return 0;
}

int parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    case 'b': case 'B': break;
    default: return -1;
    }
    /* Accept "4K", "4KB", "4KiB", "4096B": all binary. */
    if (shift && (end[0] == 'i' || end[0] == 'I'))
        end++;
    if (end[0] == 'b' || end[0] == 'B')
        end++;
    if (*end)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

void fmt_size(char *buf, size_t cap, uint64_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    while (u < 4 && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        u++;
    }
    snprintf(buf, cap, "%llu%s", (unsigned long long)n, units[u]);
}

uint64_t size_or_exit(const char *prog, const char *s)
{
    uint64_t v;
    if (parse_size(s, &v) != 0 || v == 0) {
        fprintf(stderr, "%s: '%s' is not a size like 64K\n", prog, s);
        exit(2);
    }
    return v;
}

char *touched_region(const char *prog, size_t len, int fill)
{
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "%s: mmap of %zu bytes: %s\n", prog, len, strerror(errno));
        exit(1);
    }
    memset(p, fill, len);
    return p;
}

void *map_private(size_t len, int thp)
{
    const size_t huge = 2u << 20, page = (size_t)sysconf(_SC_PAGESIZE);
    if (len == 0 || len > SIZE_MAX - huge) {
        errno = EINVAL;
        return NULL;
    }
    const size_t keep = (len + page - 1) / page * page; /* what munmap(p, len) frees */
    const size_t span = thp ? keep + huge : keep;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (!thp) {
        /* 4 KiB pages whatever the system's THP policy ("always" would give
         * huge ones): "private" means the same memory on every host. A
         * kernel without THP refuses the advice, and has small pages anyway. */
        (void)madvise(p, keep, MADV_NOHUGEPAGE);
        return p;
    }
    /* keep the 2 MiB aligned bytes inside, give back the rest (both page multiples) */
    char *a = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
    if ((a > p && munmap(p, (size_t)(a - p)) != 0) ||
        (p + span > a + keep && munmap(a + keep, (size_t)(p + span - (a + keep))) != 0))
        return NULL; /* cannot happen for ranges we mapped; errno says why */
    if (madvise(a, len, MADV_HUGEPAGE) != 0) {
        int e = errno;
        munmap(a, len);
        errno = e;
        return NULL;
    }
    return a;
}

void loopback_pair(const char *prog, int *client, int *server)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    *client = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || *client < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &alen) || connect(*client, (struct sockaddr *)&a, sizeof a) ||
        (*server = accept(l, NULL, NULL)) < 0) {
        fprintf(stderr, "%s: loopback socket pair: %s\n", prog, strerror(errno));
        exit(1);
    }
    close(l);
}
