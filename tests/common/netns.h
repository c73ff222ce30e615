/* Two network namespaces joined by a veth pair, made by a test and removed at
 * its exit: "two hosts" for tests that cut, drop or slow a link. Nothing
 * outside the namespaces is touched; the addresses (10.<net>.<p>.1 in a,
 * .2 in b, p from the pid) exist only inside them. Needs root and iproute2:
 * check with netns_usable() first. */
#ifndef KVX_TEST_NETNS_H
#define KVX_TEST_NETNS_H

typedef struct netns_pair {
    char a[32], b[32];     /* namespace names */
    char dev_a[16], dev_b[16]; /* the veth ends, one in each */
    char dev_a2[16], dev_b2[16]; /* a second pair (netns_pair_add_link), or "" */
    const char *tag;       /* the test's name, for messages */
} netns_pair;

/* 1 when this process may make namespaces (root, iproute2) and the shell
 * check needs (or NULL) passes; otherwise says why on stderr, returns 0. */
int netns_usable(const char *tag, const char *needs);
/* Makes the pair (tag: short name, also in the namespace names; net: the
 * second octet of the 10.x.y.0/24 used), removed at exit. Adds
 * tcp.listen=0.0.0.0:0 to KVX_TEST_OPTIONS so a target child advertises its
 * veth address. 0 on success. */
int netns_pair_make(netns_pair *n, const char *tag, int net);
/* A second veth pair between the two namespaces, in its own subnet
 * 10.<net>.<p>.0/24 (a second rail). 0 on success. */
int netns_pair_add_link(netns_pair *n, int net);
/* Moves the calling thread into namespace ns (asserts). */
void netns_enter(const char *ns);
/* Runs a shell command made from fmt; prints it with its exit status when
 * that is not 0, and returns the status. */
int netns_sh(const netns_pair *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An nft table in namespace ns that drops every packet in and out (a silent
 * partition: no reset, no error); netns_pass_all() deletes it again. */
void netns_drop_all(const netns_pair *n, const char *ns);
void netns_pass_all(const netns_pair *n, const char *ns);
/* Drops every packet arriving in ns, not those leaving it: applied to both
 * namespaces, the network between them loses everything while neither
 * kernel sees a local send error, so both back off their retransmissions as
 * on a real path (a local drop is retried every 500 ms without backoff).
 * netns_pass_all() undoes it. */
void netns_drop_in(const netns_pair *n, const char *ns);

#endif
