/* The bridge and namespaces of the cluster (cluster_net.h). A partition is
 * an nft rule in the bridge's namespace (cl_net_cut). */
#define _GNU_SOURCE
#include "cluster_net.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "netns.h"

static cl_net *g_net;          /* removed at exit */
static void (*g_hook)(void);   /* runs first: stops whatever lives in the namespaces */
static pid_t g_owner;          /* only the process that made it removes it */

const char *cl_net_ns(const cl_net *c, int i, char *buf, unsigned cap) {
    if (i < 0) snprintf(buf, cap, "%s-br", c->prefix);
    else snprintf(buf, cap, "%s-%d", c->prefix, i);
    return buf;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "cluster: '%s' exited %d\n", cmd, rc);
    return rc;
}

void cl_net_remove(void) {
    if (!g_net || getpid() != g_owner) return;
    if (g_hook) g_hook();
    char cmd[4096], ns[48];
    size_t at = 0;
    for (int i = -1; i < g_net->n && at < sizeof cmd - 100; i++)
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, "ip netns del %s 2>/dev/null; ",
                               cl_net_ns(g_net, i, ns, sizeof ns));
    snprintf(cmd + at, sizeof cmd - at, "true");
    if (system(cmd) != 0) fprintf(stderr, "cluster: removing the namespaces %s-* failed\n", g_net->prefix);
    g_net = NULL;
}

static void on_signal(int sig) {
    cl_net_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Host i: its namespace, the veth pair, the address, the bridge port. */
static int make_host(const cl_net *c, int i) {
    char ns[48], br[48];
    cl_net_ns(c, i, ns, sizeof ns);
    cl_net_ns(c, -1, br, sizeof br);
    return sh("ip netns add %s && ip -n %s link add p%d type veth peer name e0 netns %s && "
              "ip -n %s link set p%d master br0 up && "
              "ip -n %s addr add 10.%d.0.%d/24 dev e0 && ip -n %s link set e0 up && ip -n %s link set lo up",
              ns, br, i, ns, br, i, ns, c->net, i + 1, ns, ns);
}

int cl_net_make(cl_net *c, int n, int net, void (*on_exit_hook)(void)) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->net = net;
    snprintf(c->prefix, sizeof c->prefix, "kvxcl-%d", (int)getpid());
    g_net = c;
    g_hook = on_exit_hook;
    g_owner = getpid();
    atexit(cl_net_remove);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) signal(sigs[k], on_signal);
    char br[48];
    cl_net_ns(c, -1, br, sizeof br);
    /* STP off (the default): ports forward at once */
    if (sh("ip netns add %s && ip -n %s link add br0 type bridge && ip -n %s link set br0 up && "
           "ip -n %s link set lo up",
           br, br, br, br))
        return -1;
    for (int i = 0; i < n; i++)
        if (make_host(c, i)) return -1;
    return 0;
}

int cl_net_enter(const cl_net *c, int i) {
    char ns[48], path[96];
    snprintf(path, sizeof path, "/var/run/netns/%s", cl_net_ns(c, i, ns, sizeof ns));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = setns(fd, CLONE_NEWNET);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* The cut is made in the bridge, like a switch port that loses everything:
 * neither the cut host nor its peers see a local send error, so every
 * kernel backs off its retransmissions as on a real network (a packet
 * dropped on its way out of its own host is retried every 500 ms instead). */
void cl_net_cut(const cl_net *c, int i) {
    char br[48];
    cl_net_ns(c, -1, br, sizeof br);
    assert_int_equal(sh("ip netns exec %s nft add table bridge kvxcut%d && "
                        "ip netns exec %s nft add chain bridge kvxcut%d forward "
                        "'{ type filter hook forward priority 0; policy accept; }' && "
                        "ip netns exec %s nft add rule bridge kvxcut%d forward iifname p%d drop && "
                        "ip netns exec %s nft add rule bridge kvxcut%d forward oifname p%d drop",
                        br, i, br, i, br, i, i, br, i, i),
                     0);
}

void cl_net_heal(const cl_net *c, int i) {
    char br[48];
    assert_int_equal(sh("ip netns exec %s nft delete table bridge kvxcut%d", cl_net_ns(c, -1, br, sizeof br), i), 0);
}

void cl_net_heal_quiet(const cl_net *c, int i) {
    char br[48], cmd[160];
    snprintf(cmd, sizeof cmd, "ip netns exec %s nft delete table bridge kvxcut%d >/dev/null 2>&1",
             cl_net_ns(c, -1, br, sizeof br), i);
    if (system(cmd) != 0) { /* no table left: nothing to do */
    }
}
