/* Time and sizes (units.c): shared by kvxfer-bench and bench/ref/. */
#ifndef KVXFER_BENCH_UNITS_H
#define KVXFER_BENCH_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in ns, and in seconds; the calling thread's CPU time in ns. */
uint64_t now_ns(void);
uint64_t cpu_ns(void);
double now_s(void);
void sleep_ns(uint64_t ns);
/* "4096", "4K", "64k", "1M", "1MiB", "2G": binary suffixes. 0 on success. */
int parse_size(const char *s, uint64_t *out);
int parse_u64(const char *s, uint64_t *out);
/* A size argument of a command-line tool: parse_size() of s, or a message
 * naming prog and s and exit(2) when it is not one or is 0. */
uint64_t size_or_exit(const char *prog, const char *s);
/* "4KiB", "1MiB", or "3000B" when not a whole multiple. */
void fmt_size(char *buf, size_t cap, uint64_t n);
/* len bytes of private anonymous memory, every byte set to fill (so the
 * pages exist before anything is timed); a message naming prog and exit(1)
 * when there is no memory. */
char *touched_region(const char *prog, size_t len, int fill);
/* len bytes of private anonymous memory (untouched), or NULL with errno set.
 * thp: 2 MiB aligned and advised MADV_HUGEPAGE, so that the kernel backs it
 * with transparent huge pages where it can (THP "madvise" or "always"; NULL
 * with EINVAL on a kernel without THP); otherwise advised MADV_NOHUGEPAGE
 * (4 KiB pages whatever the system's policy). Free either with munmap(p, len). */
void *map_private(size_t len, int thp);
/* Two connected TCP sockets on 127.0.0.1 (the listener is closed again):
 * *client made the connection, *server accepted it; a message naming prog
 * and exit(1) when that fails. */
void loopback_pair(const char *prog, int *client, int *server);

#endif
