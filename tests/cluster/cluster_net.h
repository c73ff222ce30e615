/* The cluster's network: N host namespaces and one namespace holding a Linux
 * bridge, a veth pair per host (host end "e0" with 10.<net>.0.<i+1>/24 in
 * the host's namespace, the other end a port of the bridge). Names carry the
 * driver's pid (kvxcl-<pid>-<i>, kvxcl-<pid>-br), so parallel runs do not
 * collide, and nothing outside these namespaces is touched. Removed at exit,
 * also on SIGINT/SIGTERM/SIGHUP/SIGQUIT, after the hook (the driver's: kill
 * the hosts) ran. Needs root, iproute2 and nftables (see netns_usable()). */
#ifndef KVX_CLUSTER_NET_H
#define KVX_CLUSTER_NET_H

typedef struct cl_net {
    int n, net;
    char prefix[32]; /* kvxcl-<pid> */
} cl_net;

/* Makes the network; 0 on success (the failing command is printed). */
int cl_net_make(cl_net *c, int n, int net, void (*on_exit_hook)(void));
/* Removes it (idempotent; also runs at exit). */
void cl_net_remove(void);
/* Name of host i's namespace (i == -1: the bridge's), in buf. */
const char *cl_net_ns(const cl_net *c, int i, char *buf, unsigned cap);
/* Moves the calling process into host i's namespace: 0, or -1 with errno. */
int cl_net_enter(const cl_net *c, int i);
/* Drops every packet to and from host i at the bridge (nft), or lets them
 * pass again; asserts (driver only). */
void cl_net_cut(const cl_net *c, int i);
void cl_net_heal(const cl_net *c, int i);
/* Deletes a cut table that may be left (a failed scenario), quietly. */
void cl_net_heal_quiet(const cl_net *c, int i);

#endif
