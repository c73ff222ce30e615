/* The driver's view of one scenario run, for report.c. */
#ifndef KVX_CLUSTER_DRIVER_H
#define KVX_CLUSTER_DRIVER_H

#include <sys/types.h>

#include "cluster.h"

typedef struct cl_scen {
    const char *name;
    int seconds;      /* run length (default; --seconds overrides) */
    int fault_at_ms;  /* since the run began */
    int fault_ms;     /* how long the cut / stop lasts (0: a kill) */
    int nvictims;
} cl_scen;

typedef struct cl_run {
    const cl_scen *sc;
    cl_board *b;
    int n, seconds;
    pid_t pids[CL_MAX_HOSTS];
    int exited[CL_MAX_HOSTS], status[CL_MAX_HOSTS], killed[CL_MAX_HOSTS];
    double run_s;                    /* from the start of the workload to the stop */
    long fault_ms, heal_ms;          /* when the fault began and ended, since the start (-1: none) */
    char logdir[64];
} cl_run;

/* Prints the run's numbers, its checks and the machine-readable line
 * "CLUSTER_RESULT {json}"; returns the number of checks that failed. */
int cl_report(const cl_run *r);

#endif
