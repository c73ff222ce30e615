/* Shared by the conformance_api sources: test_api.c (peers, transfers,
 * cancel, close, threads), test_api_create.c (creation, options, region
 * checks), test_api_poll.c (completions) and test_api_peers.c (peer list, metrics). */
#ifndef KVXFER_TEST_API_H
#define KVXFER_TEST_API_H

#include "harness.h"

#define NB 64
#define BL 4096
#define CFG "{\"model\":\"llama\",\"layers\":32}"

typedef struct pair {
    region ra, rb;
    kvx_transport *a, *b;
    metablob mb;
} pair;

/* Two transports a (nb_a blocks of 0x11) and b (nb_b of 0x22), b added to a as "b". */
void pair_up(pair *p, uint64_t nb_a, uint64_t nb_b, const char *cfg);
/* Destroys both, checks and frees both regions' guards. */
void pair_down(pair *p);

/* test_api_create.c */
void test_create_bad_input(void **state);
void test_properties(void **state);
void test_region_prewarm(void **state);
void test_region_hugepages(void **state);

/* test_api_poll.c */
void test_many_transfers_small_poll(void **state);
void test_poll_scoped(void **state);
void test_poll_results(void **state);

/* test_api_peers.c */
void test_list_peers(void **state);
void test_metrics_text(void **state);

#endif
