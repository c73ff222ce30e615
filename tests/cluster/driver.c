/* kvx_cluster: a cluster of N hosts (default 12), each a process with one
 * tcp transport in its own network namespace, all namespaces joined by one
 * Linux bridge, every host a peer of every other (N*(N-1) links), each
 * writing batches of 4-16 blocks of 64 KiB to random peers (8 transfers in
 * flight per host) for the whole run. Every block that lands is checked by
 * its target against what the scoreboard says was written there; every
 * transfer id must surface exactly once.
 *
 * Scenarios (--scenario NAME[,NAME...] or all):
 *   nofault          20 s, no fault: no transfer fails, no byte is wrong,
 *                    every id surfaces once, every done write is verified,
 *                    every host moves verified blocks to every other.
 *   kill             two hosts are killed (SIGKILL) after 3 s: only
 *                    transfers to them may fail; the survivors remove them,
 *                    and adding a killed host's old metadata again is
 *                    refused (KVX_ECONNREFUSED).
 *   partition-short  the bridge drops every packet to and from one host
 *                    (nft, a silent switch port) for 1.5 s, less than
 *                    transfer_timeout_ms (2 s): nothing fails, no peer needs
 *                    to be re-added.
 *   partition-long   the same for 4 s: failures only on links to and from the
 *                    cut host; the hosts re-add the broken peers, and after
 *                    the heal every pair moves verified blocks again.
 *   sigstop          one host SIGSTOPped for 4 s, then SIGCONT: as
 *                    partition-long.
 * No bar on speed: the numbers (per-host MB/s, aggregate GB/s, min/median,
 * p50/p99 latency) are printed, with a CLUSTER_RESULT JSON line per scenario
 * for bench/cluster.sh. Needs root, iproute2 and nftables (exits 77, skipped,
 * without them); removes its namespaces at exit, also when interrupted.
 *
 * Usage: kvx_cluster [--hosts N] [--seconds S] [--scenario LIST] [--net X]
 * Environment: KVX_CLUSTER_HOSTS, KVX_CLUSTER_SECONDS, KVX_CLUSTER_SCENARIO,
 * KVX_CLUSTER_KEEP_LOGS=1 keeps the hosts' logs (KVX_LOG=warn unless set). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"
#include "cluster_net.h"
#include "driver.h"
#include "harness.h"
#include "netns.h"

static cl_scen g_scens[SC_COUNT] = {
    [SC_NOFAULT] = {"nofault", 20, 0, 0, 0},
    [SC_KILL] = {"kill", 8, 3000, 0, 2},
    [SC_PART_SHORT] = {"partition-short", 8, 3000, 1500, 1},
    [SC_PART_LONG] = {"partition-long", 12, 3000, 4000, 1},
    [SC_SIGSTOP] = {"sigstop", 12, 3000, 4000, 1},
};

static struct {
    int hosts, seconds, net;
    cl_net nw;
    cl_run run;
    pid_t driver;
} g = {.hosts = 12, .net = 215};

/* ---- host processes ---- */

static void kill_hosts(void) {
    if (getpid() != g.driver) return;
    for (int i = 0; i < g.run.n; i++)
        if (g.run.pids[i] > 0 && !g.run.exited[i]) {
            kill(g.run.pids[i], SIGKILL);
            waitpid(g.run.pids[i], NULL, 0);
            g.run.exited[i] = 1;
        }
}

static void child_signals(void) {
    for (int sig = 1; sig < 32; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void spawn_host(cl_run *r, int i) {
    char log[128];
    snprintf(log, sizeof log, "%s/host-%d.log", r->logdir, i);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        child_signals(); /* not cmocka's, not the namespace cleanup */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != g.driver) _exit(1);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (!getenv("KVX_LOG")) setenv("KVX_LOG", "warn", 1);
        if (cl_net_enter(&g.nw, i) != 0) {
            cl_note(r->b->hosts[i].msg, "host %d: setns: %s", i, strerror(errno));
            _exit(2);
        }
        cl_host_main(r->b, i, g.net);
    }
    r->pids[i] = pid;
    r->b->hosts[i].pid = pid;
}

/* Notes hosts that exited (any reason); 1 when one did that was not killed. */
static int reap_exits(cl_run *r) {
    int unexpected = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->exited[i] || r->pids[i] <= 0) continue;
        int st = 0;
        if (waitpid(r->pids[i], &st, WNOHANG) == r->pids[i]) {
            r->exited[i] = 1;
            r->status[i] = st;
            if (!r->killed[i] && !CL_LD(r->b->hosts[i].finished)) {
                unexpected = 1;
                CL_ST(r->b->hosts[i].gone, 1);
                print_message("cluster: host %d (pid %d) exited early: %s %d; %s\n", i, (int)r->pids[i],
                              WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
                              r->b->hosts[i].msg[0] ? r->b->hosts[i].msg : "(no message)");
            }
        }
    }
    return unexpected;
}

static int host_flag(const cl_host *h, int which) {
    switch (which) {
    case 0: return CL_LD(h->ready);
    case 1: return CL_LD(h->added);
    case 2: return CL_LD(h->drained);
    default: return CL_LD(h->finished);
    }
}

/* Waits until every host still running set flag which (0 ready, 1 added,
 * 2 drained, 3 finished), at most timeout_ms. Before the run (0, 1) a host
 * that exited or did not get there fails the test at once; later the report
 * judges (a host that died or hangs fails its checks, and the other hosts'
 * numbers are still worth printing). Returns how many did not. */
static int wait_hosts(cl_run *r, int which, const char *what, uint64_t timeout_ms) {
    uint64_t end = cl_now_ms() + timeout_ms;
    int missing = 0;
    for (;;) {
        int died = reap_exits(r);
        missing = 0;
        for (int i = 0; i < r->n; i++) missing += !r->exited[i] && !host_flag(&r->b->hosts[i], which);
        if (!missing || (died && which < 2) || cl_now_ms() > end) break;
        usleep(2000);
    }
    int early = 0;
    for (int i = 0; i < r->n; i++) early += r->exited[i] && !r->killed[i] && !host_flag(&r->b->hosts[i], which);
    if (!missing && !(early && which < 2)) return 0;
    char who[512] = "";
    size_t at = 0;
    for (int i = 0; i < r->n && at < sizeof who - 64; i++)
        if (!r->killed[i] && !host_flag(&r->b->hosts[i], which))
            at += (size_t)snprintf(who + at, sizeof who - at, " %d%s%s%s", i, r->exited[i] ? " (exited)" : "",
                                   r->b->hosts[i].msg[0] ? ": " : "", r->b->hosts[i].msg);
    if (which < 2)
        fail_msg("cluster %s: hosts not %s within %llu ms:%s (logs in %s)", r->sc->name, what,
                 (unsigned long long)timeout_ms, who, r->logdir);
    print_message("cluster %s: hosts not %s within %llu ms:%s\n", r->sc->name, what, (unsigned long long)timeout_ms,
                  who);
    return missing;
}

/* Sleeps until the run's clock reaches ms, watching for hosts that died. */
static void sleep_until(cl_run *r, long ms) {
    uint64_t t0 = CL_LD(r->b->t_run_ms);
    while ((long)(cl_now_ms() - t0) < ms) {
        reap_exits(r);
        usleep(20000);
    }
}

/* ---- faults ---- */

static void heal_mark(cl_run *r) {
    for (int i = 0; i < r->n; i++) CL_ST(r->b->hosts[i].heal_seq, CL_LD(r->b->hosts[i].seq));
    r->heal_ms = (long)(cl_now_ms() - CL_LD(r->b->t_run_ms));
}

static void fault(cl_run *r, int sc) {
    const cl_scen *s = r->sc;
    sleep_until(r, s->fault_at_ms);
    r->fault_ms = (long)(cl_now_ms() - CL_LD(r->b->t_run_ms));
    int v = r->b->victims[0];
    if (sc == SC_KILL) {
        for (int k = 0; k < r->b->nvictims; k++) {
            int i = r->b->victims[k];
            r->killed[i] = 1;
            kill(r->pids[i], SIGKILL);
        }
        for (int k = 0; k < r->b->nvictims; k++) { /* reaped: its sockets are closed, the survivors may probe */
            int i = r->b->victims[k];
            waitpid(r->pids[i], &r->status[i], 0);
            r->exited[i] = 1;
            CL_ST(r->b->hosts[i].gone, 1);
            CL_ST(r->b->hosts[i].dead, 1);
            print_message("cluster: killed host %d at %ld ms, reaped %llu ms later\n", i, r->fault_ms,
                          (unsigned long long)(cl_now_ms() - CL_LD(r->b->t_run_ms)) - (unsigned long long)r->fault_ms);
        }
        heal_mark(r);
        return;
    }
    if (sc == SC_SIGSTOP) {
        child_target c = {.pid = r->pids[v]}; /* child_freeze() only needs the pid */
        child_freeze(&c);
    } else {
        cl_net_cut(&g.nw, v);
    }
    sleep_until(r, r->fault_ms + s->fault_ms);
    if (sc == SC_SIGSTOP) assert_int_equal(kill(r->pids[v], SIGCONT), 0);
    else cl_net_heal(&g.nw, v);
    heal_mark(r);
    print_message("cluster: host %d %s from %ld to %ld ms\n", v, sc == SC_SIGSTOP ? "stopped" : "cut off", r->fault_ms,
                  r->heal_ms);
}

/* ---- one scenario ---- */

static void pick_victims(cl_board *b, int sc) {
    b->nvictims = g_scens[sc].nvictims;
    if (sc == SC_KILL) {
        b->victims[0] = b->n / 3;
        b->victims[1] = 2 * b->n / 3;
    } else {
        b->victims[0] = b->n / 2;
    }
}

static int run_seconds(const cl_scen *s) {
    if (!g.seconds) return s->seconds;
    int least = s->fault_at_ms ? (s->fault_at_ms + s->fault_ms) / 1000 + 4 : 1;
    if (g.seconds >= least) return g.seconds;
    print_message("cluster: %s needs at least %d s (the fault and its aftermath): running %d s\n", s->name, least,
                  least);
    return least;
}

static void test_scenario(void **state) {
    const cl_scen *s = *state;
    const int sc = (int)(s - g_scens);
    cl_run *r = &g.run;
    char logdir[64];
    memcpy(logdir, r->logdir, sizeof logdir);
    memset(r, 0, sizeof *r);
    memcpy(r->logdir, logdir, sizeof logdir);
    r->sc = s;
    r->n = g.hosts;
    r->seconds = run_seconds(s);
    r->fault_ms = r->heal_ms = -1;
    r->b = cl_board_new(r->n, sc);
    assert_non_null(r->b);
    pick_victims(r->b, sc);
    print_message("cluster: %s: %d hosts, %d s, tcp, transfer_timeout_ms %d, batches of %d-%d x 64 KiB, %d in flight\n",
                  s->name, r->n, r->seconds, CL_TIMEOUT_MS, CL_MIN_BATCH, CL_MAX_BATCH, CL_INFLIGHT);
    for (int i = 0; i < r->n; i++) spawn_host(r, i);
    wait_hosts(r, 0, "ready (transport created)", 30000);
    CL_ST(r->b->phase, PH_ADD);
    wait_hosts(r, 1, "connected to every peer", 60000);
    CL_ST(r->b->t_run_ms, cl_now_ms());
    CL_ST(r->b->phase, PH_RUN);
    if (s->fault_at_ms) fault(r, sc);
    sleep_until(r, (long)r->seconds * 1000);
    CL_ST(r->b->t_stop_ms, cl_now_ms());
    r->run_s = (double)(CL_LD(r->b->t_stop_ms) - CL_LD(r->b->t_run_ms)) / 1000.0;
    CL_ST(r->b->phase, PH_STOP);
    wait_hosts(r, 2, "drained (every id surfaced)", 3 * CL_TIMEOUT_MS + CL_CONNECT_MS + 20000);
    CL_ST(r->b->phase, PH_FINAL);
    wait_hosts(r, 3, "finished (final verification)", 60000);
    uint64_t end = cl_now_ms() + 20000;
    for (int left = 1; left && cl_now_ms() < end;) {
        reap_exits(r);
        left = 0;
        for (int i = 0; i < r->n; i++) left += !r->exited[i];
        if (left) usleep(10000);
    }
    for (int i = 0; i < r->n; i++) /* hung: its numbers so far are reported, it fails the checks */
        if (!r->exited[i]) {
            print_message("cluster: host %d (pid %d) did not exit: killed\n", i, (int)r->pids[i]);
            kill(r->pids[i], SIGKILL);
            waitpid(r->pids[i], &r->status[i], 0);
            r->exited[i] = 1;
        }
    int bad = cl_report(r);
    if (bad) fail_msg("cluster %s: %d check(s) failed (see FAIL lines above)", s->name, bad);
}

static int teardown_scenario(void **state) {
    (void)state;
    kill_hosts();
    cl_run *r = &g.run;
    if (r->b) {
        for (int k = 0; k < r->b->nvictims; k++) cl_net_heal_quiet(&g.nw, r->b->victims[k]);
        cl_board_free(r->b);
        r->b = NULL;
    }
    return 0;
}

/* ---- group ---- */

static void remove_logs(void) {
    if (getpid() != g.driver || !g.run.logdir[0]) return;
    if (getenv("KVX_CLUSTER_KEEP_LOGS")) {
        fprintf(stderr, "cluster: host logs kept in %s\n", g.run.logdir);
    } else {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g.run.logdir);
        if (system(cmd) != 0) fprintf(stderr, "cluster: could not remove %s\n", g.run.logdir);
    }
    g.run.logdir[0] = 0;
}

/* At exit, also on a signal (cluster_net.c): the hosts, then the logs. */
static void on_exit_hook(void) {
    kill_hosts();
    remove_logs();
}

static int group_setup(void **state) {
    (void)state;
    if (!netns_usable("cluster", "nft --version >/dev/null 2>&1")) exit(77); /* skipped */
    snprintf(g.run.logdir, sizeof g.run.logdir, "/tmp/kvxcl-%d-XXXXXX", (int)getpid());
    if (!mkdtemp(g.run.logdir)) {
        fprintf(stderr, "cluster: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    atexit(remove_logs);
    uint64_t t0 = cl_now_ms();
    if (cl_net_make(&g.nw, g.hosts, g.net, on_exit_hook) != 0) return -1;
    print_message("cluster: %d namespaces on bridge %s-br (10.%d.0.0/24) made in %llu ms\n", g.hosts, g.nw.prefix,
                  g.net, (unsigned long long)(cl_now_ms() - t0));
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    kill_hosts();
    cl_net_remove();
    return 0;
}

static void usage(const char *me) {
    fprintf(stderr,
            "usage: %s [--hosts N (3..%d, default 12)] [--seconds S (default: per scenario)]\n"
            "          [--scenario all|nofault,kill,partition-short,partition-long,sigstop] [--net 1..254]\n",
            me, CL_MAX_HOSTS);
    exit(2);
}

static int parse_int(const char *v, int lo, int hi, const char *me) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) usage(me);
    return (int)x;
}

/* Adds the scenarios named in list (comma-separated, or "all") to tests. */
static size_t select_scenarios(const char *list, struct CMUnitTest *tests, const char *me) {
    size_t k = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int sc = 0; sc < SC_COUNT && k < SC_COUNT; sc++)
            if (strcmp(name, "all") == 0 || strcmp(name, g_scens[sc].name) == 0) {
                tests[k++] = (struct CMUnitTest){g_scens[sc].name, test_scenario, NULL, teardown_scenario, &g_scens[sc]};
                found = 1;
            }
        if (!found) usage(me);
    }
    return k;
}

int main(int argc, char **argv) {
    g.driver = getpid();
    const char *env = getenv("KVX_CLUSTER_HOSTS"), *list = getenv("KVX_CLUSTER_SCENARIO");
    if (env && *env) g.hosts = parse_int(env, 3, CL_MAX_HOSTS, argv[0]);
    if ((env = getenv("KVX_CLUSTER_SECONDS")) && *env) g.seconds = parse_int(env, 1, 3600, argv[0]);
    if (!list || !*list) list = "all";
    for (int a = 1; a < argc; a += 2) { /* --flag value */
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (strcmp(argv[a], "--hosts") == 0) g.hosts = parse_int(v, 3, CL_MAX_HOSTS, argv[0]);
        else if (strcmp(argv[a], "--seconds") == 0) g.seconds = parse_int(v, 1, 3600, argv[0]);
        else if (strcmp(argv[a], "--net") == 0) g.net = parse_int(v, 1, 254, argv[0]);
        else if (strcmp(argv[a], "--scenario") == 0 && v) list = v;
        else usage(argv[0]);
    }
    struct CMUnitTest tests[SC_COUNT];
    size_t k = select_scenarios(list, tests, argv[0]);
    for (size_t i = 0; i < k; i++)
        if (tests[i].initial_state == &g_scens[SC_KILL] && g.hosts < 5) {
            fprintf(stderr, "cluster: kill needs at least 5 hosts\n");
            return 2;
        }
    return _cmocka_run_group_tests("cluster", tests, k, group_setup, group_teardown);
}
