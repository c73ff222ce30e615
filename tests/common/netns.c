#define _GNU_SOURCE
#include "netns.h"

#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static netns_pair *g_pair; /* removed at exit */

static void cleanup(void) {
    if (!g_pair) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", g_pair->a, g_pair->b);
    if (system(cmd) != 0) fprintf(stderr, "%s: cleanup of %s, %s failed\n", g_pair->tag, g_pair->a, g_pair->b);
}

int netns_sh(const netns_pair *n, const char *fmt, ...) {
    char cmd[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) print_message("%s: '%s' exited %d\n", n->tag, cmd, rc);
    return rc;
}

int netns_usable(const char *tag, const char *needs) {
    char check[256];
    snprintf(check, sizeof check, "ip netns list >/dev/null 2>&1%s%s", needs ? " && " : "", needs ? needs : "");
    if (geteuid() == 0 && system(check) == 0) return 1;
    fprintf(stderr, "%s: needs root and iproute2%s%s: skipped\n", tag, needs ? " and: " : "", needs ? needs : "");
    return 0;
}

int netns_pair_make(netns_pair *n, const char *tag, int net) {
    memset(n, 0, sizeof *n);
    n->tag = tag;
    const int pid = (int)getpid(), p = pid % 250 + 1;
    snprintf(n->a, sizeof n->a, "kvx%.6sa%d", tag, pid);
    snprintf(n->b, sizeof n->b, "kvx%.6sb%d", tag, pid);
    snprintf(n->dev_a, sizeof n->dev_a, "kva%d", p);
    snprintf(n->dev_b, sizeof n->dev_b, "kvb%d", p);
    g_pair = n;
    atexit(cleanup);
    const char *env = getenv("KVX_TEST_OPTIONS");
    char opts[2048];
    snprintf(opts, sizeof opts, "%s tcp.listen=0.0.0.0:0", env ? env : "");
    setenv("KVX_TEST_OPTIONS", opts, 1);
    if (netns_sh(n, "ip netns add %s && ip netns add %s", n->a, n->b) ||
        netns_sh(n, "ip link add %s netns %s type veth peer name %s netns %s", n->dev_a, n->a, n->dev_b, n->b))
        return -1;
    const char *ns[2] = {n->a, n->b}, *dev[2] = {n->dev_a, n->dev_b};
    for (int i = 0; i < 2; i++)
        if (netns_sh(n, "ip -n %s addr add 10.%d.%d.%d/24 dev %s && ip -n %s link set %s up && ip -n %s link set lo up",
                     ns[i], net, p, i + 1, dev[i], ns[i], dev[i], ns[i]))
            return -1;
    return 0;
}

int netns_pair_add_link(netns_pair *n, int net) {
    const int p = (int)getpid() % 250 + 1;
    snprintf(n->dev_a2, sizeof n->dev_a2, "kvA%d", p);
    snprintf(n->dev_b2, sizeof n->dev_b2, "kvB%d", p);
    if (netns_sh(n, "ip link add %s netns %s type veth peer name %s netns %s", n->dev_a2, n->a, n->dev_b2, n->b))
        return -1;
    const char *ns[2] = {n->a, n->b}, *dev[2] = {n->dev_a2, n->dev_b2};
    for (int i = 0; i < 2; i++)
        if (netns_sh(n, "ip -n %s addr add 10.%d.%d.%d/24 dev %s && ip -n %s link set %s up", ns[i], net, p, i + 1,
                     dev[i], ns[i], dev[i]))
            return -1;
    return 0;
}

void netns_enter(const char *ns) {
    char path[96];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(setns(fd, CLONE_NEWNET), 0);
    close(fd);
}

void netns_drop_all(const netns_pair *n, const char *ns) {
    assert_int_equal(netns_sh(n,
                              "ip netns exec %s nft add table inet kvxcut && "
                              "ip netns exec %s nft add chain inet kvxcut in '{ type filter hook input priority 0; policy drop; }' && "
                              "ip netns exec %s nft add chain inet kvxcut out '{ type filter hook output priority 0; policy drop; }'",
                              ns, ns, ns),
                     0);
}

void netns_drop_in(const netns_pair *n, const char *ns) {
    assert_int_equal(netns_sh(n,
                              "ip netns exec %s nft add table inet kvxcut && "
                              "ip netns exec %s nft add chain inet kvxcut in '{ type filter hook input priority 0; policy drop; }'",
                              ns, ns),
                     0);
}

void netns_pass_all(const netns_pair *n, const char *ns) {
    assert_int_equal(netns_sh(n, "ip netns exec %s nft delete table inet kvxcut", ns), 0);
}
