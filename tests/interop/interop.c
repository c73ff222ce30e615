/* The C side of the cross-language interop test (PROTOCOL.md beside this
 * file): `interop target DIR` or `interop initiator DIR`. */
#include <kvxfer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NB 16
#define BL 4096
#define CFG "{\"model\":\"interop\",\"layers\":2}"

static int die(const char *what, int rc) {
    fprintf(stderr, "interop(c): %s: %s: %s\n", what, kvx_strerror(rc), kvx_last_error_message());
    return 1;
}

static kvx_transport *make(uint8_t *region) {
    kvx_options *o;
    kvx_transport *t = NULL;
    const char *backend = getenv("KVX_INTEROP_BACKEND");  /* the cross-version runs narrow it */
    if (kvx_options_create(&o) || kvx_options_set(o, "backend", backend ? backend : "shm,tcp") ||
        kvx_options_set(o, "tcp.listen", "127.0.0.1:0"))
        return NULL;
    int rc = kvx_transport_create(&t, region, NB, BL, CFG, o);
    kvx_options_destroy(o);
    if (rc) die("create", rc);
    return t;
}

static int wait_file(const char *path, int seconds) {
    for (int i = 0; i < seconds * 20; i++) {
        if (access(path, F_OK) == 0) return 0;
        usleep(50 * 1000);
    }
    return -1;
}

static int target(const char *dir) {
    static uint8_t region[NB * BL];
    kvx_transport *t = make(region);
    if (!t) return 1;
    uint8_t meta[4096];
    size_t len;
    uint64_t base;
    char fp[KVX_FINGERPRINT_LEN + 1], path[4096], tmp[4096];
    int rc = kvx_get_agent_metadata(&len, t, meta, sizeof meta);
    if (rc) return die("metadata", rc);
    kvx_transport_base_addr(&base, t);
    kvx_transport_config_fingerprint(fp, t);
    printf("fingerprint %s\n", fp);
    fflush(stdout);
    snprintf(path, sizeof path, "%s/target.json", dir);
    snprintf(tmp, sizeof tmp, "%s/target.json.tmp", dir);
    FILE *f = fopen(tmp, "w");
    if (!f) return 1;
    fprintf(f, "{\"metadata\": \"");
    for (size_t i = 0; i < len; i++) fprintf(f, "%02x", meta[i]);
    fprintf(f, "\", \"base_addr\": %llu, \"num_blocks\": %d, \"block_len\": %d, \"fingerprint\": \"%s\"}\n",
            (unsigned long long)base, NB, BL, fp);
    fclose(f);
    rename(tmp, path);
    snprintf(path, sizeof path, "%s/done", dir);
    if (wait_file(path, 60)) {
        fprintf(stderr, "interop(c): no initiator finished within 60 s\n");
        return 1;
    }
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < BL; i++)
            if (region[b * BL + i] != ((b * 37 + 11) & 0xff)) {
                fprintf(stderr, "interop(c): block %d byte %d is 0x%02x\n", b, i, region[b * BL + i]);
                return 1;
            }
    kvx_transport_destroy(t);
    printf("verified\n");
    return 0;
}

/* Reads "key": value from the small JSON file the target wrote. */
static const char *field(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p) return NULL;
    p = strchr(p + strlen(pat), ':');
    if (!p) return NULL;
    p++;
    while (*p == ' ' || *p == '"') p++;
    return p;
}

static int initiator(const char *dir) {
    static uint8_t region[NB * BL];
    for (int b = 0; b < NB; b++) memset(region + b * BL, (b * 37 + 11) & 0xff, BL);
    char path[4096], fp[KVX_FINGERPRINT_LEN + 1];
    snprintf(path, sizeof path, "%s/target.json", dir);
    kvx_transport *t = make(region);
    if (!t) return 1;
    kvx_transport_config_fingerprint(fp, t);
    printf("fingerprint %s\n", fp);
    fflush(stdout);
    if (wait_file(path, 60)) return 1;
    static char json[65536];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(json, 1, sizeof json - 1, f) : 0;
    if (f) fclose(f);
    json[n] = 0;
    const char *hex = field(json, "metadata");
    if (!hex) return 1;
    static uint8_t meta[16384];
    size_t ml = 0;
    while (hex[0] != '"' && hex[1] && ml < sizeof meta) {
        unsigned v;
        if (sscanf(hex, "%2x", &v) != 1) return 1;
        meta[ml++] = (uint8_t)v;
        hex += 2;
    }
    uint64_t base = strtoull(field(json, "base_addr"), NULL, 10);
    uint64_t nb = strtoull(field(json, "num_blocks"), NULL, 10);
    uint64_t bl = strtoull(field(json, "block_len"), NULL, 10);
    int rc = kvx_add_remote_peer(t, "target", meta, ml, base, nb, bl);
    const char *be = "", *how = "";
    if (rc == 0 && (rc = kvx_peer_backend(&be, &how, t, "target")) == 0) printf("path %s %s\n", be, how);
    if (rc) return die("add_remote_peer", rc);
    uint64_t idx[NB], id;
    for (int i = 0; i < NB; i++) idx[i] = (uint64_t)i;
    rc = kvx_write_blocks(&id, t, "target", idx, idx, NB);
    if (rc) return die("write_blocks", rc);
    for (int i = 0; i < 30000; i++) {
        size_t nd, nf;
        uint64_t d[4], fl[4];
        rc = kvx_poll(&nd, &nf, t, NULL, d, 4, fl, 4);
        if (rc) return die("poll", rc);
        if (nf) {
            fprintf(stderr, "interop(c): transfer failed\n");
            return 1;
        }
        if (nd) {
            snprintf(path, sizeof path, "%s/done", dir);
            FILE *d2 = fopen(path, "w");
            if (d2) fclose(d2);
            kvx_transport_destroy(t);
            printf("sent\n");
            return 0;
        }
        usleep(1000);
    }
    fprintf(stderr, "interop(c): transfer not done within 30 s\n");
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: interop target|initiator DIR\n");
        return 2;
    }
    if (strcmp(argv[1], "target") == 0) return target(argv[2]);
    if (strcmp(argv[1], "initiator") == 0) return initiator(argv[2]);
    fprintf(stderr, "usage: interop target|initiator DIR\n");
    return 2;
}
