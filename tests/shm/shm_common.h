/* Helpers of the shm conformance tests (test_shm_paths.c, test_shm_threads.c). */
#pragma once

#include <stdint.h>

#include "kvxfer.h"

/* Options for backend (tcp on 127.0.0.1:0) plus extra, a "KEY=VALUE ..." list
 * (kvx_options_parse), or NULL. */
kvx_options *opts(const char *backend, const char *extra);
/* A transport over nb x bl at base; destroys o. */
kvx_transport *make(uint8_t *base, uint64_t nb, uint64_t bl, kvx_options *o);
/* Asserts the path kvx_peer_backend() names for peer (path NULL: any). */
void expect_path(kvx_transport *t, const char *peer, const char *backend, const char *path);
/* Adds b to a as peer "b". */
void connect_ab(kvx_transport *a, kvx_transport *b);
/* A guarded region inside a shareable mapping: [guard | len | guard], the
 * middle filled with fill; returns its start. */
uint8_t *guarded(uint8_t *mem, uint64_t len, uint8_t fill);
