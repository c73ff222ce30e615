/*
 * kvxfer-tls-ref: a reference line of bench/compare-tcp.sh for
 * tcp.protection=aead. What one TLS 1.3 stream over loopback moves with
 * OpenSSL at its best on this machine, with no library and no protocol of
 * ours in the way: the same cipher as kvxfer's protected tcp
 * (TLS_AES_128_GCM_SHA256), on the same cores as the TCP copies.
 * `openssl speed` measures the AEAD alone on an idle core and iperf3 the TCP
 * copies alone; a protected stream pays for both at once, and on a host where
 * both ends share the cores (loopback, 2 cores) neither of those lines can be
 * reached by any protected stream. This one can.
 *
 * A writer thread sends BLOCK_SIZE blocks of a source region in order with
 * SSL_write (records of 16 KiB, the TLS maximum); the reader receives each
 * into the next block of a destination region with SSL_read (read-ahead on,
 * so one read() fetches many records). Both regions are REGION_BYTES, touched
 * first. After WARMUP seconds, the next SECONDS are timed. Prints one JSON line:
 * {"block_size":N,"region":N,"cipher":"TLS_AES_128_GCM_SHA256","gb_per_s":G}.
 *
 *   kvxfer-tls-ref BLOCK_SIZE REGION_BYTES SECONDS WARMUP
 *
 * The certificate is a throwaway P-256 key signed by itself, made at start;
 * the client does not verify it (a reference of throughput, not of trust).
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../units.h"

static const char *me = "kvxfer-tls-ref";
static atomic_bool stop;

static void die_ssl(const char *what) {
    fprintf(stderr, "%s: %s failed\n", me, what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

struct side {
    SSL *ssl;
    char *region;
    size_t block, blocks, next;
};

/* Sends or receives one whole block; false once the other side is gone. */
static int move_block(struct side *s, int writing) {
    char *p = s->region + s->next * s->block;
    s->next = (s->next + 1) % s->blocks;
    for (size_t off = 0; off < s->block;) {
        size_t got = 0;
        int ok = writing ? SSL_write_ex(s->ssl, p + off, s->block - off, &got)
                         : SSL_read_ex(s->ssl, p + off, s->block - off, &got);
        if (!ok)
            return 0;
        off += got;
    }
    return 1;
}

static void *write_all(void *arg) {
    struct side *s = arg;
    while (!atomic_load(&stop) && move_block(s, 1)) {
    }
    return NULL;
}

/* A self-signed P-256 certificate for the server side. */
static void self_signed(SSL_CTX *ctx) {
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    if (!key || !x)
        die_ssl("key generation");
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"kvxfer-tls-ref", -1, -1, 0);
    X509_set_issuer_name(x, n);
    X509_set_pubkey(x, key);
    if (!X509_sign(x, key, EVP_sha256()) || SSL_CTX_use_certificate(ctx, x) != 1 ||
        SSL_CTX_use_PrivateKey(ctx, key) != 1)
        die_ssl("self-signed certificate");
    X509_free(x);
    EVP_PKEY_free(key);
}

static SSL_CTX *context(int server) {
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256"))
        die_ssl("SSL_CTX setup");
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_read_buffer_len(ctx, 256 * 1024);
    if (server)
        self_signed(ctx);
    else
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    return ctx;
}

struct hs {
    SSL *ssl;
    int ok;
};

static void *accept_side(void *arg) {
    struct hs *h = arg;
    h->ok = SSL_accept(h->ssl) == 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: kvxfer-tls-ref BLOCK_SIZE REGION_BYTES SECONDS WARMUP\n");
        return 2;
    }
    size_t block = (size_t)size_or_exit(me, argv[1]), region_len = (size_t)size_or_exit(me, argv[2]);
    double seconds = atof(argv[3]), warmup = atof(argv[4]);
    if (block == 0 || region_len % block || region_len / block < 2 || !(seconds > 0) || warmup < 0) {
        fprintf(stderr, "%s: need block > 0, a region of at least 2 whole blocks, seconds > 0, warmup >= 0\n", me);
        return 2;
    }
    struct side w = {.region = touched_region(me, region_len, 0x5a), .block = block, .blocks = region_len / block};
    struct side r = w;
    r.region = touched_region(me, region_len, 0xa5);

    int cfd, sfd, one = 1;
    loopback_pair(me, &cfd, &sfd);
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    SSL_CTX *sctx = context(1), *cctx = context(0);
    struct hs h = {.ssl = SSL_new(sctx)};
    w.ssl = SSL_new(cctx);
    if (!h.ssl || !w.ssl || !SSL_set_fd(h.ssl, sfd) || !SSL_set_fd(w.ssl, cfd))
        die_ssl("SSL_new");
    r.ssl = h.ssl;
    pthread_t t;
    pthread_create(&t, NULL, accept_side, &h);
    int cok = SSL_connect(w.ssl) == 1;
    pthread_join(t, NULL);
    if (!cok || !h.ok)
        die_ssl("TLS handshake");
    const char *cipher = SSL_get_cipher_name(w.ssl);

    signal(SIGPIPE, SIG_IGN); /* the writer learns of the end from a failed write */
    pthread_create(&t, NULL, write_all, &w);
    const double t0 = now_s();
    double start = 0;
    uint64_t blocks = 0;
    for (double now = t0; now - t0 < warmup + seconds; now = now_s()) {
        if (start == 0 && now - t0 >= warmup) {
            start = now;
            blocks = 0;
        }
        if (!move_block(&r, 0))
            die_ssl("SSL_read");
        blocks++;
    }
    const double took = now_s() - start;
    atomic_store(&stop, 1);
    shutdown(sfd, SHUT_RDWR);
    pthread_join(t, NULL);
    printf("{\"block_size\":%zu,\"region\":%zu,\"cipher\":\"%s\",\"gb_per_s\":%.4f}\n", block, region_len, cipher,
           (double)(blocks * block) / took / 1e9);
    return 0;
}
