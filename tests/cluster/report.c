/* What a scenario run moved and how fast (printed, never asserted), and the
 * checks of its behaviour (each printed as ok or FAIL, the failures counted
 * for the driver). The last line is "CLUSTER_RESULT {json}" for scripts. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "driver.h"
#include "kvxfer.h"

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)

typedef struct sums {
    uint64_t bytes, done, failed, failed_unexpected, submit_errors, submit_unexpected, readds, readds_done;
    uint64_t reg_failures, id_errors, api_errors, wrong, reverify_bad, guard_bad, verified;
    int64_t unverified; /* done and never verified (< 0: verified more than was done) */
    uint64_t hist[CL_LAT_BUCKETS];
    double mb_min, mb_med, mb_max;
    int checks_failed;
} sums;

static int check(sums *s, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int check(sums *s, int ok, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    print_message("  %s %s\n", ok ? "ok:  " : "FAIL:", buf);
    if (!ok) s->checks_failed++;
    return ok;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double ms(uint64_t ns) { return (double)ns / 1e6; }

static void codes_str(const cl_code *tab, char *out, size_t cap) {
    size_t at = 0;
    out[0] = 0;
    for (int k = 0; k < CL_CODES && tab[k].n && at < cap; k++)
        at += (size_t)snprintf(out + at, cap - at, "%s%llu x %d %s", k ? ", " : "", (unsigned long long)tab[k].n,
                               tab[k].code, kvx_strerror(tab[k].code));
}

/* A link may fail in this scenario: to a killed host; to or from the cut or stopped one. */
static int may_fail(const cl_run *r, int w, int t) {
    switch (r->b->scenario) {
    case SC_KILL: return cl_is_victim(r->b, t);
    case SC_PART_LONG:
    case SC_SIGSTOP: return cl_is_victim(r->b, w) || cl_is_victim(r->b, t);
    default: return 0;
    }
}

static void host_lines(const cl_run *r, sums *s) {
    double mb[CL_MAX_HOSTS];
    int nmb = 0;
    print_message("  host   MB/s   xfers  failed  submit-err  re-adds  verified-in  wrong   p50 ms   p99 ms\n");
    for (int i = 0; i < r->n; i++) {
        cl_host *h = &r->b->hosts[i];
        double rate = (double)LD(h->bytes_done) / r->run_s / 1e6;
        if (!r->killed[i]) mb[nmb++] = rate;
        uint64_t hist[CL_LAT_BUCKETS];
        for (int k = 0; k < CL_LAT_BUCKETS; k++) s->hist[k] += hist[k] = LD(h->lat[k]);
        print_message("  %4d %7.1f %7llu %7llu %11llu %4llu/%-4llu %11llu %6llu %8.2f %8.2f%s\n", i, rate,
                      (unsigned long long)LD(h->xfers_done), (unsigned long long)LD(h->xfers_failed),
                      (unsigned long long)LD(h->submit_errors), (unsigned long long)LD(h->readds_done),
                      (unsigned long long)LD(h->readds_started), (unsigned long long)LD(h->checked),
                      (unsigned long long)LD(h->wrong), ms(cl_lat_pct(hist, 0.5)), ms(cl_lat_pct(hist, 0.99)),
                      r->killed[i] ? "  (killed)" : cl_is_victim(r->b, i) ? "  (victim)" : "");
        char codes[256];
        codes_str(h->submit_codes, codes, sizeof codes);
        if (codes[0]) print_message("       host %d: kvx_write_blocks failed: %s\n", i, codes);
        codes_str(h->reg_codes, codes, sizeof codes);
        if (codes[0]) print_message("       host %d: re-adds failed: %s\n", i, codes);
        if (h->msg[0]) print_message("       host %d: %s\n", i, h->msg);
        if (h->wrong_msg[0]) print_message("       host %d: %s\n", i, h->wrong_msg);
        s->bytes += LD(h->bytes_done);
        s->done += LD(h->xfers_done);
        s->failed += LD(h->xfers_failed);
        s->submit_errors += LD(h->submit_errors);
        s->readds += LD(h->readds_started);
        s->readds_done += LD(h->readds_done);
        s->reg_failures += LD(h->reg_failures);
        s->id_errors += LD(h->unknown_ids) + LD(h->dup_ids) + LD(h->missing_ids);
        s->api_errors += LD(h->api_errors);
        s->wrong += LD(h->wrong);
        s->reverify_bad += LD(h->reverify_bad);
        s->guard_bad += LD(h->guard_bad);
        s->verified += LD(h->checked);
    }
    qsort(mb, (size_t)nmb, sizeof mb[0], cmp_double);
    s->mb_min = mb[0];
    s->mb_max = mb[nmb - 1];
    s->mb_med = nmb % 2 ? mb[nmb / 2] : (mb[nmb / 2 - 1] + mb[nmb / 2]) / 2;
}

/* When the failures came, against the fault (printed: no bar on time). */
static void fail_window(const cl_run *r) {
    uint64_t first = UINT64_MAX, last = 0;
    for (int w = 0; w < r->n; w++)
        for (int t = 0; t < r->n; t++) {
            cl_pair *p = cl_pair_at(r->b, w, t);
            if (w == t || !LD(p->failed_xfers)) continue;
            if (LD(p->first_fail_ms) < first) first = LD(p->first_fail_ms);
            if (LD(p->last_fail_ms) > last) last = LD(p->last_fail_ms);
        }
    if (first == UINT64_MAX || r->fault_ms < 0) return;
    print_message("  failures from %+lld to %+lld ms of the fault's start (it lasted %ld ms; transfer_timeout_ms %d)\n",
                  (long long)first - r->fault_ms, (long long)last - r->fault_ms, r->heal_ms - r->fault_ms,
                  CL_TIMEOUT_MS);
}

/* Links with failures, and the pair counters the checks need. */
static void link_lines(const cl_run *r, sums *s) {
    char line[2048];
    size_t at = 0;
    for (int w = 0; w < r->n; w++)
        for (int t = 0; t < r->n; t++) {
            if (w == t) continue;
            cl_pair *p = cl_pair_at(r->b, w, t);
            uint64_t f = LD(p->failed_xfers), e = LD(p->submit_errors);
            if (!may_fail(r, w, t)) {
                s->failed_unexpected += f;
                s->submit_unexpected += e;
            }
            if (!f || at > sizeof line - 80) continue;
            at += (size_t)snprintf(line + at, sizeof line - at, " %d->%d: %llu (%llu-%llu ms)", w, t,
                                   (unsigned long long)f, (unsigned long long)LD(p->first_fail_ms),
                                   (unsigned long long)LD(p->last_fail_ms));
        }
    if (at) print_message("  failed transfers by link (writer->target: n (first-last, since the start)):%s\n", line);
    fail_window(r);
}

/* The hosts' logs (KVX_LOG=warn): what the library said during the run;
 * lines after the shutdown mark (peers closing one after the other) are only counted. */
static void log_lines(const cl_run *r) {
    for (int i = 0; i < r->n; i++) {
        char path[128], buf[512], first[512] = "";
        snprintf(path, sizeof path, "%s/host-%d.log", r->logdir, i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int lines = 0, stalls = 0, after = 0, over = 0;
        while (fgets(buf, sizeof buf, f)) {
            if (strncmp(buf, CL_LOG_SHUTDOWN, strlen(CL_LOG_SHUTDOWN)) == 0) over = 1;
            else if (over) after++;
            else if (!lines++) snprintf(first, sizeof first, "%s", buf);
            stalls += !over && strstr(buf, "made no progress") != NULL;
        }
        fclose(f);
        first[strcspn(first, "\n")] = 0;
        if (lines)
            print_message("  log host %d: %d line(s) during the run (%d \"made no progress\"), %d at shutdown; "
                          "first: %.300s\n", i, lines, stalls, after, first);
    }
}

static void common_checks(const cl_run *r, sums *s) {
    int early = 0, nverif = 0, noprog = 0;
    char who[512] = "", short_lived[512] = "";
    size_t at = 0, at_short = 0;
    for (int i = 0; i < r->n; i++) {
        int st = r->status[i];
        if (!r->killed[i] && !(r->exited[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0 && LD(r->b->hosts[i].finished)))
            early++;
    }
    check(s, !early, "every host not killed finished and exited 0 (%d did not)", early);
    check(s, !s->id_errors, "every transfer id surfaced exactly once (%llu unknown, repeated or missing)",
          (unsigned long long)s->id_errors);
    check(s, !s->api_errors, "no unexpected API error (poll, wait, remove, registration status): %llu",
          (unsigned long long)s->api_errors);
    check(s, !s->wrong && !s->reverify_bad, "no wrong block: %llu wrong at the check, %llu changed after it",
          (unsigned long long)s->wrong, (unsigned long long)s->reverify_bad);
    check(s, !s->guard_bad, "the guard bytes around every region are intact");
    for (int w = 0; w < r->n; w++)
        for (int t = 0; t < r->n; t++) {
            if (w == t) continue;
            cl_pair *p = cl_pair_at(r->b, w, t);
            int64_t gap = (int64_t)LD(p->done_blocks) - (int64_t)LD(p->verified);
            if (!LD(r->b->hosts[w].gone) && !LD(r->b->hosts[t].gone) && gap != 0) { /* a death fails on its own */
                s->unverified += gap;
                nverif++;
            }
            if (LD(p->verified)) continue;
            if (r->killed[w] || r->killed[t]) { /* it had only the time before the kill */
                if (at_short < sizeof short_lived - 16)
                    at_short += (size_t)snprintf(short_lived + at_short, sizeof short_lived - at_short, " %d->%d", w, t);
                continue;
            }
            noprog++;
            if (at < sizeof who - 16) at += (size_t)snprintf(who + at, sizeof who - at, " %d->%d", w, t);
        }
    if (at_short) print_message("  links of a killed host that moved no verified block before the kill:%s\n", short_lived);
    check(s, !nverif, "every block reported done was verified by its target (%d links with %lld unverified)", nverif,
          (long long)s->unverified);
    int alive = r->n - (r->b->scenario == SC_KILL ? r->b->nvictims : 0);
    check(s, !noprog, "every host moved verified blocks to every other%s (%d of %d links did not:%s)",
          r->b->scenario == SC_KILL ? " that lived through the run" : "", noprog, alive * (alive - 1), who);
}

static void kill_checks(const cl_run *r, sums *s) {
    int bad_probe = 0, probes = 0, not_removed = 0, bad_peers = 0;
    int want_peers = r->n - 1 - r->b->nvictims;
    for (int w = 0; w < r->n; w++) {
        if (r->killed[w]) continue;
        for (int k = 0; k < r->b->nvictims; k++) {
            int v = r->b->victims[k];
            cl_pair *p = cl_pair_at(r->b, w, v);
            not_removed += !LD(p->removed);
            if (!LD(p->probe_done)) {
                bad_probe++;
                continue;
            }
            int rc = LD(p->probe_rc);
            if (probes++ == 0 || rc != KVX_ECONNREFUSED)
                print_message("  host %d: kvx_add_remote_peer of killed host %d's old metadata -> %d (%s): %s\n", w,
                              v, rc, kvx_strerror(rc), p->probe_msg);
            bad_probe += rc != KVX_ECONNREFUSED;
        }
        bad_peers += (int)LD(r->b->hosts[w].peers_final) != want_peers;
    }
    check(s, !s->failed_unexpected, "no transfer failed between survivors (%llu did)",
          (unsigned long long)s->failed_unexpected);
    check(s, !s->submit_unexpected, "no kvx_write_blocks failed between survivors (%llu did)",
          (unsigned long long)s->submit_unexpected);
    check(s, !not_removed && !bad_peers, "every survivor removed the killed hosts (%d not removed; %d survivors with "
          "a peer count other than %d)", not_removed, bad_peers, want_peers);
    check(s, !bad_probe, "adding a killed host's old metadata again is refused with %d (%s) (%d of %d were not)",
          KVX_ECONNREFUSED, kvx_strerror(KVX_ECONNREFUSED), bad_probe, (r->n - r->b->nvictims) * r->b->nvictims);
}

/* partition-long and sigstop: failures only on the victim's links, and
 * traffic on every link after the heal. */
static void heal_checks(const cl_run *r, sums *s) {
    int v = r->b->victims[0], quiet = 0;
    uint64_t on_victim = 0;
    char who[512] = "";
    size_t at = 0;
    for (int w = 0; w < r->n; w++)
        for (int t = 0; t < r->n; t++) {
            if (w == t) continue;
            cl_pair *p = cl_pair_at(r->b, w, t);
            if (w == v || t == v) on_victim += LD(p->failed_xfers) + LD(p->submit_errors);
            if (!LD(p->verified_after_heal)) {
                quiet++;
                if (at < sizeof who - 16) at += (size_t)snprintf(who + at, sizeof who - at, " %d->%d", w, t);
            }
        }
    check(s, !s->failed_unexpected && !s->submit_unexpected,
          "transfers failed only on links to or from host %d (%llu failed and %llu submits refused elsewhere)", v,
          (unsigned long long)s->failed_unexpected, (unsigned long long)s->submit_unexpected);
    check(s, on_victim > 0, "the %s host's stalled links were noticed (%llu failures on them)",
          r->b->scenario == SC_SIGSTOP ? "stopped" : "cut", (unsigned long long)on_victim);
    check(s, !quiet, "after the heal every link moved verified blocks again (%d of %d did not:%s)", quiet,
          r->n * (r->n - 1), who);
}

static void scenario_checks(const cl_run *r, sums *s) {
    switch (r->b->scenario) {
    case SC_NOFAULT:
    case SC_PART_SHORT:
        check(s, !s->failed, "no transfer failed (%llu did)", (unsigned long long)s->failed);
        check(s, !s->submit_errors, "no kvx_write_blocks failed (%llu did)", (unsigned long long)s->submit_errors);
        check(s, !s->readds, "no peer needed to be removed and re-added (%llu re-adds)", (unsigned long long)s->readds);
        break;
    case SC_KILL: kill_checks(r, s); break;
    default: heal_checks(r, s); break;
    }
}

static void json_line(const cl_run *r, const sums *s) {
    print_message("CLUSTER_RESULT {\"scenario\":\"%s\",\"hosts\":%d,\"seconds\":%.2f,\"gb_per_s\":%.4f,"
                  "\"host_mb_per_s_min\":%.1f,\"host_mb_per_s_median\":%.1f,\"host_mb_per_s_max\":%.1f,"
                  "\"min_median_ratio\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"transfers\":%llu,\"failed\":%llu,"
                  "\"failed_unexpected\":%llu,\"submit_errors\":%llu,\"readds\":%llu,\"wrong_blocks\":%llu,"
                  "\"verified_blocks\":%llu,\"unverified_blocks\":%lld,\"id_errors\":%llu,\"checks_failed\":%d}\n",
                  r->sc->name, r->n, r->run_s, (double)s->bytes / r->run_s / 1e9, s->mb_min, s->mb_med, s->mb_max,
                  s->mb_med > 0 ? s->mb_min / s->mb_med : 0.0, ms(cl_lat_pct(s->hist, 0.5)),
                  ms(cl_lat_pct(s->hist, 0.99)), (unsigned long long)s->done, (unsigned long long)s->failed,
                  (unsigned long long)s->failed_unexpected, (unsigned long long)s->submit_errors,
                  (unsigned long long)s->readds, (unsigned long long)(s->wrong + s->reverify_bad),
                  (unsigned long long)s->verified, (long long)s->unverified,
                  (unsigned long long)s->id_errors, s->checks_failed);
}

int cl_report(const cl_run *r) {
    sums s;
    memset(&s, 0, sizeof s);
    print_message("cluster %s: %d hosts, %.2f s of workload%s\n", r->sc->name, r->n, r->run_s,
                  r->fault_ms >= 0 ? "" : ", no fault");
    if (r->fault_ms >= 0) print_message("  fault from %ld to %ld ms\n", r->fault_ms, r->heal_ms);
    host_lines(r, &s);
    link_lines(r, &s);
    log_lines(r);
    print_message("  aggregate %.3f GB/s; per host MB/s min %.1f median %.1f max %.1f (min/median %.2f%s); "
                  "latency p50 %.2f ms p99 %.2f ms; %llu transfers done, %llu failed, %llu submits refused, "
                  "%llu re-adds (%llu done, %llu failed attempts); %llu blocks verified\n",
                  (double)s.bytes / r->run_s / 1e9, s.mb_min, s.mb_med, s.mb_max,
                  s.mb_med > 0 ? s.mb_min / s.mb_med : 0.0, r->b->scenario == SC_KILL ? ", survivors" : "",
                  ms(cl_lat_pct(s.hist, 0.5)), ms(cl_lat_pct(s.hist, 0.99)), (unsigned long long)s.done,
                  (unsigned long long)s.failed, (unsigned long long)s.submit_errors, (unsigned long long)s.readds,
                  (unsigned long long)s.readds_done, (unsigned long long)s.reg_failures,
                  (unsigned long long)s.verified);
    common_checks(r, &s);
    scenario_checks(r, &s);
    json_line(r, &s);
    return s.checks_failed;
}
