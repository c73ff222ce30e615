/* The multi-backend transport and the shm backend on one host: which path a
 * peer gets (auto, restricted lists, fallback, strict), the mapped path over
 * kvx_region_alloc() and over a /dev/shm file (vLLM's case) with canaries,
 * a target that truncates its file
 * under a writer (SIGBUS must not kill the writer), the application's own
 * memfd, and private memory through a staging ring (asked for, and taken
 * when the kernel refuses process_vm_writev). The copy threads:
 * test_shm_threads.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "shm_common.h"

enum { NB = 64, BL = 4096 };

/* Writes a run, a reversed pair and singles a -> b, checks every block of b
 * (written ones match, the others keep fill) and b's guards. */
static void check_transfer(kvx_transport *a, uint8_t *src, uint8_t *dst, uint64_t nb, uint64_t bl, uint8_t fill,
                           const uint8_t *guard_lo, const uint8_t *guard_hi) {
    for (uint64_t i = 0; i < nb; i++) fill_block(src + i * bl, bl, i, 11);
    uint64_t l[] = {3, 4, 5, 6, 7, 8, 9, 10, 40, 39, 0, 63, 17};
    uint64_t r[] = {20, 21, 22, 23, 24, 25, 26, 27, 50, 49, 63, 0, 33};
    const size_t n = sizeof l / sizeof l[0];
    uint64_t id;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, n));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    uint8_t written[NB] = {0};
    for (size_t i = 0; i < n; i++) {
        assert_true(block_matches(dst + r[i] * bl, bl, l[i], 11));
        written[r[i]] = 1;
    }
    for (uint64_t i = 0; i < nb; i++)
        if (!written[i]) assert_true(block_is(dst + i * bl, bl, fill));
    for (size_t i = 0; i < GUARD_LEN; i++) assert_true(guard_lo[i] == 0xA5 && guard_hi[i] == 0xA5);
}

/* auto serves on every backend; a same-host peer gets shm (private memory:
 * through the kernel), and the transport names shm as its first backend. */
static void test_auto_picks_shm(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 0x22);
    kvx_transport *a = make(ra.base, NB, BL, opts("auto", NULL));
    kvx_transport *b = make(rb.base, NB, BL, opts("auto", NULL));
    assert_string_equal(kvx_transport_backend(a), "shm");
    connect_ab(a, b);
    expect_path(a, "b", "shm", "process_vm_writev");
    const char *x = NULL;
    CHECK_ERR(kvx_peer_backend(&x, NULL, a, "nobody"), KVX_ENOENT);
    check_transfer(a, ra.base, rb.base, NB, BL, 0x22, rb.mem, rb.base + NB * BL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* A list restricts; the pick is the first backend both sides serve. */
static void test_backend_lists(void **state) {
    (void)state;
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_ERR(kvx_options_set(o, "backend", "shm,shm"), KVX_EINVAL);
    CHECK_ERR(kvx_options_set(o, "backend", "shm,"), KVX_EINVAL);
    CHECK_ERR(kvx_options_set(o, "backend", "shm,pigeon"), KVX_EINVAL);
    CHECK_OK(kvx_options_set(o, "backend", "tcp,shm"));
    kvx_options_destroy(o);
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 0x22);
    kvx_transport *a = make(ra.base, NB, BL, opts("tcp", NULL));
    kvx_transport *b = make(rb.base, NB, BL, opts("shm,tcp", NULL));
    assert_string_equal(kvx_transport_backend(b), "shm");
    /* every backend served, in order: what b's metadata offers */
    assert_string_equal(kvx_transport_backends(b), "shm,tcp");
    assert_string_equal(kvx_transport_backends(a), "tcp");
    assert_string_equal(kvx_transport_backends(NULL), "");
    connect_ab(a, b);
    expect_path(a, "b", "tcp", "");
    check_transfer(a, ra.base, rb.base, NB, BL, 0x22, rb.mem, rb.base + NB * BL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    /* a target that only serves shm and an initiator without it: nothing in common */
    a = make(ra.base, NB, BL, opts("tcp", NULL));
    b = make(rb.base, NB, BL, opts("shm", NULL));
    metablob m;
    get_meta(b, &m);
    CHECK_ERR(kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl), KVX_ENOTSUP);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* Metadata whose shm socket name is changed (checksum recomputed): shm
 * applies (same host) but cannot connect. Fallback takes tcp; strict fails. */
static void break_shm_socket(metablob *m) {
    const char *needle = "kvxfer-shm-";
    for (size_t i = 0; i + strlen(needle) < m->len; i++)
        if (memcmp(m->bytes + i, needle, strlen(needle)) == 0) {
            m->bytes[i + strlen(needle)] = 'x';
            uint8_t d[SHA256_DIGEST_LENGTH];
            SHA256(m->bytes, m->len - 8, d);
            memcpy(m->bytes + m->len - 8, d, 8);
            return;
        }
    fail_msg("no shm section in the metadata");
}

static void test_fallback_and_strict(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 0x22);
    kvx_transport *b = make(rb.base, NB, BL, opts("shm,tcp", NULL));
    metablob m;
    get_meta(b, &m);
    break_shm_socket(&m);
    kvx_transport *a = make(ra.base, NB, BL, opts("shm,tcp", NULL));
    CHECK_OK(kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl));
    expect_path(a, "b", "tcp", "");
    kvx_transport_destroy(a);
    a = make(ra.base, NB, BL, opts("shm,tcp", "peer_backend_fallback=0"));
    CHECK_ERR(kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl), KVX_ECONNREFUSED);
    assert_non_null(strstr(kvx_last_error_message(), "peer_backend_fallback=0"));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* fd sized and mapped MAP_SHARED (*mem, *len bytes) for a guarded NB x BL
 * region filled with 0x22, which is returned. */
static uint8_t *map_file(int fd, uint8_t **mem, size_t *len) {
    *len = NB * BL + 2 * GUARD_LEN;
    assert_int_equal(ftruncate(fd, (off_t)*len), 0);
    *mem = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(*mem != MAP_FAILED);
    return guarded(*mem, NB * BL, 0x22);
}

/* kvx_region_alloc() memory: the writer maps it and copies directly. */
static void test_mapped_region_alloc(void **state) {
    (void)state;
    void *mem = NULL;
    CHECK_ERR(kvx_region_alloc(&mem, 0, 0), KVX_EINVAL);
    CHECK_ERR(kvx_region_alloc(&mem, 4096, 0x80), KVX_EINVAL);
    CHECK_OK(kvx_region_alloc(&mem, NB * BL + 2 * GUARD_LEN, 0));
    uint8_t *tb = guarded(mem, NB * BL, 0x22);
    region ra = region_new(NB, BL, 1);
    kvx_transport *a = make(ra.base, NB, BL, opts("shm", NULL));
    kvx_transport *b = make(tb, NB, BL, opts("shm", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "mapped");
    check_transfer(a, ra.base, tb, NB, BL, 0x22, tb - GUARD_LEN, tb + NB * BL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_region_free(mem);
    kvx_region_free(NULL);
    region_free(&ra);
}

/* vLLM's case: the region is an mmap of a file under /dev/shm. Found without
 * any option; then the target truncates the file under the writer: the
 * writer's copy faults (SIGBUS), the transfer fails, the writer lives on. */
static void test_dev_shm_file_and_truncation(void **state) {
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/kvxfer-test-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) skip();
    size_t len;
    uint8_t *mem;
    uint8_t *tb = map_file(fd, &mem, &len);
    region ra = region_new(NB, BL, 1);
    kvx_transport *a = make(ra.base, NB, BL, opts("auto", NULL));
    kvx_transport *b = make(tb, NB, BL, opts("auto", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "mapped");
    check_transfer(a, ra.base, tb, NB, BL, 0x22, mem, tb + NB * BL);

    assert_int_equal(ftruncate(fd, 0), 0);  /* the target shrinks its file */
    uint64_t l[] = {1, 2, 3}, r[] = {5, 6, 7}, id;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 3));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 1);
    CHECK_ERR(kvx_write_blocks(&id, a, "b", l, r, 3), KVX_EPEERBROKEN);
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    munmap(mem, len);
    close(fd);
    unlink(path);
    region_free(&ra);
}

/* A region in a file on a disk file system (not tmpfs or hugetlbfs) is not
 * offered mapped: a writer's page faults there could wait on the disk (or a
 * FUSE server) without bound. The target takes the process_vm_writev path. */
static void test_disk_file_not_mapped(void **state) {
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/var/tmp/kvxfer-test-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    struct statfs fs;
    if (fd < 0 || fstatfs(fd, &fs) != 0 || fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC) {
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        print_message("/var/tmp is not a disk file system here: skipped\n");
        skip();
    }
    size_t len;
    uint8_t *mem;
    uint8_t *tb = map_file(fd, &mem, &len);
    region ra = region_new(NB, BL, 1);
    kvx_transport *a = make(ra.base, NB, BL, opts("auto", NULL));
    kvx_transport *b = make(tb, NB, BL, opts("auto", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "process_vm_writev");
    check_transfer(a, ra.base, tb, NB, BL, 0x22, mem, tb + NB * BL);
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    munmap(mem, len);
    close(fd);
    unlink(path);
    region_free(&ra);
}

/* A SIGBUS that is not the writer's copy faulting in a peer's mapping goes
 * where it went before kvxfer installed its guard. The child sets SIGBUS to
 * the default through a struct with SA_SIGINFO (a common way to reset a
 * handler), makes a mapped transfer (which installs the guard), then either
 * touches a truncated file of its own (how == 0) or writes from a local
 * region whose file it truncated (how == 1: the fault is in the source, not
 * the peer's mapping). Either way it must die of SIGBUS: not hang on the
 * faulting instruction, not report a broken peer and live on. */
static void sigbus_child(int how) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGBUS, &sa, NULL) != 0) _exit(10);
    char pb[64], pl[64];
    snprintf(pb, sizeof pb, "/dev/shm/kvxfer-test-bus-b-%d", (int)getpid());
    snprintf(pl, sizeof pl, "/dev/shm/kvxfer-test-bus-l-%d", (int)getpid());
    int fb = open(pb, O_RDWR | O_CREAT | O_EXCL, 0600), fl = open(pl, O_RDWR | O_CREAT | O_EXCL, 0600);
    unlink(pb);
    unlink(pl);
    if (fb < 0 || fl < 0) _exit(11);
    const size_t len = NB * BL;
    if (ftruncate(fb, (off_t)len) != 0 || ftruncate(fl, (off_t)len) != 0) _exit(12);
    uint8_t *tb = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fb, 0);
    uint8_t *la = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fl, 0);
    if (tb == MAP_FAILED || la == MAP_FAILED) _exit(13);
    kvx_transport *a = NULL, *b = NULL;
    if (kvx_transport_create(&a, la, NB, BL, NULL, opts("shm", NULL)) != 0 ||
        kvx_transport_create(&b, tb, NB, BL, NULL, opts("shm", NULL)) != 0)
        _exit(14);
    metablob m;
    get_meta(b, &m);
    if (kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl) != 0) _exit(15);
    const char *bk = "", *path = "";
    if (kvx_peer_backend(&bk, &path, a, "b") != 0 || strcmp(path, "mapped") != 0) _exit(16);
    uint64_t l[] = {1}, r[] = {2}, id;
    size_t nf = 9;
    if (kvx_write_blocks(&id, a, "b", l, r, 1) != 0 || wait_ids(a, "b", &id, 1, 20000, &nf, NULL) != 1 || nf != 0)
        _exit(17);  /* the guard is in place now */
    if (how == 0) {
        char pc[64];
        snprintf(pc, sizeof pc, "/dev/shm/kvxfer-test-bus-c-%d", (int)getpid());
        int fc = open(pc, O_RDWR | O_CREAT | O_EXCL, 0600);
        unlink(pc);
        if (fc < 0 || ftruncate(fc, 4096) != 0) _exit(18);
        volatile uint8_t *c = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fc, 0);
        if (c == MAP_FAILED || ftruncate(fc, 0) != 0) _exit(19);
        c[0] = 1; /* SIGBUS: past the end of the file */
        _exit(20);
    }
    if (ftruncate(fl, 0) != 0) _exit(21); /* our own source region loses its pages */
    if (kvx_write_blocks(&id, a, "b", l, r, 1) != 0) _exit(22);
    wait_ids(a, "b", &id, 1, 5000, &nf, NULL);
    _exit(23); /* the fault was taken for the peer's */
}

static void test_foreign_sigbus(void **state) {
    (void)state;
    if (access("/dev/shm", W_OK) != 0) skip();
    for (int how = 0; how < 2; how++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) sigbus_child(how);
        int st = 0;
        pid_t w = 0;
        for (int i = 0; i < 300 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++) usleep(50000);
        if (w == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("case %d: the child hung on its SIGBUS (still alive after 15 s)", how);
        }
        if (WIFEXITED(st)) fail_msg("case %d: the child exited with %d instead of dying of SIGBUS", how, WEXITSTATUS(st));
        assert_true(WIFSIGNALED(st));
        assert_int_equal(WTERMSIG(st), SIGBUS);
    }
}

/* The application's own memfd (Python's mmap of one, say): found through
 * the read-write descriptor the process holds, with no option; once that
 * descriptor is closed the region is private memory as far as kvxfer can
 * tell, and the kernel path is taken. */
static void test_app_memfd(void **state) {
    (void)state;
    int fd = memfd_create("kvxfer-test-app", MFD_CLOEXEC);
    assert_true(fd >= 0);
    size_t len;
    uint8_t *mem;
    uint8_t *tb = map_file(fd, &mem, &len);
    region ra = region_new(NB, BL, 1);
    kvx_transport *a = make(ra.base, NB, BL, opts("shm", NULL));
    kvx_transport *b = make(tb, NB, BL, opts("shm", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "mapped");
    check_transfer(a, ra.base, tb, NB, BL, 0x22, mem, tb + NB * BL);
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    kvx_transport_destroy(b);

    char self[64];  /* a read-only descriptor of it does not do */
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int ro = open(self, O_RDONLY | O_CLOEXEC);
    assert_true(ro >= 0);
    close(fd);
    memset(tb, 0x22, NB * BL);
    b = make(tb, NB, BL, opts("shm", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "process_vm_writev");
    check_transfer(a, ra.base, tb, NB, BL, 0x22, mem, tb + NB * BL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    close(ro);
    munmap(mem, len);
    region_free(&ra);
}

/* shm.private=staged: private memory written through the target's staging
 * ring (8 slots of 1 MiB). Small blocks with canaries, then 1 MiB + 4 KiB
 * blocks (pieces that do not fill a slot) over two copy threads, 12 MiB in
 * one transfer: the ring is reused while the transfer runs. */
static void test_staged_ring(void **state) {
    (void)state;
    region rb = region_new(NB, BL, 0x22);
    region ra = region_new(NB, BL, 1);
    kvx_transport *a = make(ra.base, NB, BL, opts("shm", NULL));
    kvx_transport *b = make(rb.base, NB, BL, opts("shm", "shm.private=staged"));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "staged");
    check_transfer(a, ra.base, rb.base, NB, BL, 0x22, rb.base - GUARD_LEN, rb.base + NB * BL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);

    enum { TNB = 16, TBL = (1 << 20) + 4096 };
    ra = region_new(TNB, TBL, 1);
    rb = region_new(TNB, TBL, 0x33);
    a = make(ra.base, TNB, TBL, opts("shm", "shm.threads=2"));
    b = make(rb.base, TNB, TBL, opts("shm", "shm.private=staged"));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "staged");
    for (uint64_t i = 0; i < TNB; i++) fill_block(ra.base + i * TBL, TBL, i, 6);
    uint64_t l[12], r[12], id;
    for (int i = 0; i < 12; i++) l[i] = 15 - i, r[i] = 2 + i;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 12));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < TNB; i++) {
        if (i >= 2 && i < 14) assert_true(block_matches(rb.base + i * TBL, TBL, 17 - i, 6));
        else assert_true(block_is(rb.base + i * TBL, TBL, 0x33));
    }
    assert_true(region_guards_ok(&rb));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* Failed means it never lands, through the ring too: the target (a child)
 * is frozen with a transfer's slots posted and its COPY messages queued
 * (and more transfers queued behind them: kvx_write_blocks() never waits);
 * the writer removes the peer (its transfers fail, its slots are withdrawn);
 * the target resumes, reads the queued COPYs, and copies none of them. */
static void test_staged_withdrawn_never_land(void **state) {
    (void)state;
    enum { TNB = 8, TBL = 1 << 20 };
    const char *topts[] = {"backend=shm", "shm.private=staged", NULL};
    child_target c;
    child_start_opts(&c, TNB, TBL, NULL, topts, 0);
    region ra = region_new(TNB, TBL, 1);
    for (uint64_t i = 0; i < TNB; i++) fill_block(ra.base + i * TBL, TBL, i, 4);
    kvx_transport *a = make(ra.base, TNB, TBL, opts("shm", "transfer_timeout_ms=3000"));
    add_peer(a, "t", &c.meta);
    expect_path(a, "t", "shm", "staged");
    uint64_t l[] = {0, 1, 2}, r[] = {5, 6, 7}, id, one = 3, three = 3;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &one, &three, 1));  /* the ring works before the freeze */
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "t", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    child_freeze(&c);
    /* More than the ring holds (8 slots of 1 MiB): every call returns at once,
     * queued or posted; none waits for the frozen target (a wait would last
     * until the stall timeout, and the transfers would have failed by the
     * poll below). */
    for (int k = 0; k < 4; k++) CHECK_OK(kvx_write_blocks(&id, a, "t", l, r, 3));
    size_t nd = 0, nfl = 0;
    uint64_t got[8];
    CHECK_OK(kvx_poll(&nd, &nfl, a, "t", got, 4, got + 4, 4));
    assert_int_equal(nd + nfl, 0);
    CHECK_OK(kvx_remove_remote_peer(a, "t"));
    assert_int_equal(kill(c.pid, SIGCONT), 0);
    assert_true(child_verify(&c, 3, 3, 4));
    assert_true(child_untouched(&c, &three, 1));  /* blocks 5, 6, 7 kept their fill */
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&ra);
}

/* Reads or writes /proc/sys/vm/nr_hugepages; -1 when it cannot. */
static long huge_pages_reserved(long set) {
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", set < 0 ? "r" : "w");
    long v = -1;
    if (!f) return -1;
    if (set < 0) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
    } else {
        v = fprintf(f, "%ld\n", set) > 0 ? set : -1;
    }
    return fclose(f) == 0 ? v : -1;
}

/* Huge pages, both ways a region gets them: kvx_region_alloc() with
 * KVX_REGION_HUGE_PAGES (a hugetlb memfd), and a file on a hugetlbfs mount
 * (the writer maps it at a huge-page-aligned offset). Both take the mapped
 * path and land exactly the requested blocks. Needs free huge pages: as
 * root the test reserves 8 (16 MiB) and gives them back; otherwise skipped. */
static void test_huge_pages(void **state) {
    (void)state;
    enum { HNB = 4, HBL = 1 << 20 };
    const long before = huge_pages_reserved(-1);
    if (before < 0 || huge_pages_reserved(before + 8) != before + 8) skip();
    void *mem = NULL;
    int rc = kvx_region_alloc(&mem, (uint64_t)HNB * HBL, KVX_REGION_HUGE_PAGES);
    if (rc == KVX_ENOMEM || rc == KVX_ENOTSUP) {
        huge_pages_reserved(before);
        skip();
    }
    CHECK_OK(rc);
    assert_int_equal((uintptr_t)mem % (2u << 20), 0);
    region ra = region_new(HNB, HBL, 1);
    for (uint64_t i = 0; i < HNB; i++) fill_block(ra.base + i * HBL, HBL, i, 12);
    kvx_transport *a = make(ra.base, HNB, HBL, opts("shm", NULL));
    memset(mem, 0x44, (size_t)HNB * HBL);
    kvx_transport *b = make(mem, HNB, HBL, opts("shm", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "mapped");
    uint64_t l[] = {0, 3}, r[] = {2, 1}, id;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 2));
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    uint8_t *hb = mem;
    assert_true(block_matches(hb + 2 * HBL, HBL, 0, 12) && block_matches(hb + HBL, HBL, 3, 12));
    assert_true(block_is(hb, HBL, 0x44) && block_is(hb + 3 * HBL, HBL, 0x44));
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    kvx_transport_destroy(b);
    kvx_region_free(mem);

    char dir[] = "/tmp/kvxfer-hugetlbfs-XXXXXX", mnt[128], path[160];
    assert_non_null(mkdtemp(dir));
    snprintf(mnt, sizeof mnt, "mount -t hugetlbfs -o pagesize=2M none %s 2>/dev/null", dir);
    if (system(mnt) == 0) {
        snprintf(path, sizeof path, "%s/region", dir);
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        const size_t len = (size_t)(HNB + 2) * HBL;  /* the region 2 MiB into the file */
        assert_int_equal(ftruncate(fd, (off_t)len), 0);
        uint8_t *fm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(fm != MAP_FAILED);
        memset(fm, 0x55, len);
        b = make(fm + 2 * HBL, HNB, HBL, opts("shm", NULL));
        connect_ab(a, b);
        expect_path(a, "b", "shm", "mapped");
        CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 2));
        assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
        assert_int_equal(nf, 0);
        hb = fm + 2 * HBL;
        assert_true(block_matches(hb + 2 * HBL, HBL, 0, 12) && block_matches(hb + HBL, HBL, 3, 12));
        assert_true(block_is(fm, 2 * HBL, 0x55) && block_is(hb, HBL, 0x55) && block_is(hb + 3 * HBL, HBL, 0x55));
        kvx_transport_destroy(b);
        munmap(fm, len);
        close(fd);
        unlink(path);
        snprintf(mnt, sizeof mnt, "umount %s", dir);
        assert_int_equal(system(mnt), 0);
    } else {
        print_message("no hugetlbfs mount here: only the memfd half ran\n");
    }
    rmdir(dir);
    kvx_transport_destroy(a);
    region_free(&ra);
    huge_pages_reserved(before);
}

/* Drops CAP_SYS_PTRACE from this process's effective set: process_vm_writev
 * into a process that is not dumpable then fails with EPERM, as it does for
 * a non-root writer. 0 or -1. */
static int drop_ptrace_cap(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0) return -1;
    d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    return (int)syscall(SYS_capset, &h, d);
}

/* The kernel refuses the writer (the target is not dumpable, the writer has
 * no CAP_SYS_PTRACE): with the default shm.private=auto the writer takes a
 * staging ring instead of falling back to tcp. The writer is a child forked
 * before any transport exists here; it reports by exit code. */
static void test_staged_when_the_kernel_refuses(void **state) {
    (void)state;
    int to_child[2];
    assert_int_equal(pipe(to_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        metablob m;
        if (drop_ptrace_cap() != 0 || read_full(to_child[0], &m, sizeof m) != 0) _exit(10);
        region ra = region_new(NB, BL, 1);
        for (uint64_t i = 0; i < NB; i++) fill_block(ra.base + i * BL, BL, i, 8);
        kvx_transport *a = NULL;
        const char *b = "", *path = "";
        uint64_t l[] = {4, 5, 9}, r[] = {10, 11, 60}, id, got[4];
        size_t nd = 0, nfl = 0;
        if (kvx_transport_create(&a, ra.base, NB, BL, NULL, opts("shm", NULL)) != 0) _exit(11);
        if (kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl) != 0) _exit(12);
        if (kvx_peer_backend(&b, &path, a, "b") != 0 || strcmp(path, "staged") != 0) _exit(13);
        if (kvx_write_blocks(&id, a, "b", l, r, 3) != 0) _exit(14);
        for (int i = 0; i < 20000 && nd + nfl == 0; i++) {
            if (kvx_poll(&nd, &nfl, a, "b", got, 4, got + 2, 2) != 0) _exit(15);
            usleep(1000);
        }
        _exit(nd == 1 && nfl == 0 && got[0] == id ? 0 : 16);  /* the child's transport dies with it */
    }
    close(to_child[0]);
    region rb = region_new(NB, BL, 0x22);
    kvx_transport *b = make(rb.base, NB, BL, opts("shm", NULL));
    static metablob m;
    get_meta(b, &m);
    assert_int_equal(prctl(PR_SET_DUMPABLE, 0), 0);
    assert_int_equal(write_full(to_child[1], &m, sizeof m), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(prctl(PR_SET_DUMPABLE, 1), 0);
    close(to_child[1]);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    for (uint64_t i = 0; i < NB; i++) {
        if (i == 10 || i == 11 || i == 60) assert_true(block_matches(rb.base + i * BL, BL, i == 60 ? 9 : i - 6, 8));
        else assert_true(block_is(rb.base + i * BL, BL, 0x22));
    }
    assert_true(region_guards_ok(&rb));
    kvx_transport_destroy(b);
    region_free(&rb);
}

/* Two threads close the target at once while a writer copies into its region
 * (mapped path): each close returns 0, and only once nothing lands any more.
 * A close that found the other one under way used to return at once, while
 * the writer's copy threads still wrote (the review saw 610 KB change). */
enum { CNB = 16, CBL = 1 << 20 };
typedef struct {
    kvx_transport *a;
    atomic_int stop;
} close_writer;
typedef struct {
    kvx_transport *b;
    const uint8_t *region;
    pthread_barrier_t *go;
    int rc;
    size_t changed; /* bytes of the region that changed after close returned */
} closer;

static void *close_write_loop(void *arg) {
    close_writer *w = arg;
    uint64_t l[CNB], r[CNB], id, d[256], f[256];
    size_t nd, nf;
    for (unsigned k = 0; !atomic_load(&w->stop); k++) {
        for (int i = 0; i < CNB; i++) l[i] = (k & 1) * CNB + i, r[i] = i;
        if (kvx_write_blocks(&id, w->a, "b", l, r, CNB) != 0) break; /* the target revoked us */
        kvx_poll(&nd, &nf, w->a, NULL, d, 256, f, 256);
    }
    return NULL;
}

static void *close_and_watch(void *arg) {
    closer *c = arg;
    uint8_t *snap = malloc((size_t)CNB * CBL);
    pthread_barrier_wait(c->go);
    c->rc = kvx_transport_close(c->b);
    memcpy(snap, c->region, (size_t)CNB * CBL);
    usleep(100 * 1000);
    for (size_t i = 0; i < (size_t)CNB * CBL; i++) c->changed += snap[i] != c->region[i];
    free(snap);
    return NULL;
}

static void test_concurrent_close_waits(void **state) {
    (void)state;
    for (int round = 0; round < 3; round++) {
        void *mem = NULL;
        CHECK_OK(kvx_region_alloc(&mem, (uint64_t)CNB * CBL, 0));
        region ra = region_new(2 * CNB, CBL, 0x11);
        memset(ra.base + (size_t)CNB * CBL, 0x22, (size_t)CNB * CBL);
        kvx_transport *a = make(ra.base, 2 * CNB, CBL, opts("shm", NULL));
        kvx_transport *b = make(mem, CNB, CBL, opts("shm", NULL));
        connect_ab(a, b);
        expect_path(a, "b", "shm", "mapped");
        close_writer w = {.a = a};
        pthread_t wt, ct[2];
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        closer c[2] = {{.b = b, .region = mem, .go = &go}, {.b = b, .region = mem, .go = &go}};
        assert_int_equal(pthread_create(&wt, NULL, close_write_loop, &w), 0);
        usleep(20 * 1000);
        for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&ct[i], NULL, close_and_watch, &c[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(ct[i], NULL);
        atomic_store(&w.stop, 1);
        pthread_join(wt, NULL);
        print_message("round %d: bytes changed after each close returned: %zu, %zu\n", round, c[0].changed,
                      c[1].changed);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(c[i].rc, 0);
            assert_int_equal(c[i].changed, 0);
        }
        pthread_barrier_destroy(&go);
        kvx_transport_destroy(a);
        kvx_transport_destroy(b);
        kvx_region_free(mem);
        region_free(&ra);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_picks_shm),
        cmocka_unit_test(test_backend_lists),
        cmocka_unit_test(test_fallback_and_strict),
        cmocka_unit_test(test_mapped_region_alloc),
        cmocka_unit_test(test_dev_shm_file_and_truncation),
        cmocka_unit_test(test_disk_file_not_mapped),
        cmocka_unit_test(test_foreign_sigbus),
        cmocka_unit_test(test_app_memfd),
        cmocka_unit_test(test_huge_pages),
        cmocka_unit_test(test_staged_ring),
        cmocka_unit_test(test_staged_withdrawn_never_land),
        cmocka_unit_test(test_staged_when_the_kernel_refuses),
        cmocka_unit_test(test_concurrent_close_waits),
    };
    return cmocka_run_group_tests_name("shm", tests, NULL, NULL);
}
