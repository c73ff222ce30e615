/* kvx_transport_create() over a region of each given size in GiB: the time
 * registering the region takes (once per rail on verbs), median of 3 with
 * min and max, for the options in KVX_TEST_OPTIONS (e.g. verbs.devices=rxe0
 * against verbs.devices=all). Prints figures; no time bar.
 *   perf_create BACKEND GIB...      e.g. perf_create verbs 1 4 */
#include <kvxfer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: perf_create BACKEND GIB...\n");
        return 2;
    }
    const char *extra = getenv("KVX_TEST_OPTIONS");
    for (int a = 2; a < argc; a++) {
        const uint64_t bl = 1 << 20, nb = strtoull(argv[a], NULL, 10) << 10;
        void *base = NULL;
        if (kvx_region_alloc(&base, nb * bl, 0) != 0) {
            fprintf(stderr, "cannot allocate %s GiB: %s\n", argv[a], kvx_last_error_message());
            return 1;
        }
        memset(base, 1, nb * bl); /* every page present: what is timed is the registration */
        double t[3];
        for (int r = 0; r < 3; r++) {
            kvx_options *o = NULL;
            kvx_options_create(&o);
            kvx_options_set(o, "backend", argv[1]);
            if (extra && kvx_options_parse(o, extra) != 0) return 1;
            kvx_transport *tr = NULL;
            double t0 = now_s();
            int rc = kvx_transport_create(&tr, base, nb, bl, NULL, o);
            t[r] = now_s() - t0;
            kvx_options_destroy(o);
            if (rc != 0) {
                fprintf(stderr, "create over %s GiB: %s\n", argv[a], kvx_last_error_message());
                return 1;
            }
            kvx_transport_destroy(tr);
        }
        qsort(t, 3, sizeof t[0], cmp);
        printf("{\"backend\": \"%s\", \"options\": \"%s\", \"gib\": %s, \"create_s_median\": %.3f, \"min\": %.3f, "
               "\"max\": %.3f}\n", argv[1], extra ? extra : "", argv[a], t[1], t[0], t[2]);
        kvx_region_free(base);
    }
    return 0;
}
