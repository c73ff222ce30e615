// Host identity, the identity of the process at the other end of the
// socket, and the datagram helpers of the shm backend's socket.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "backends/shm/shm.h"
#include "util/error.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; the same number on every architecture but alpha, mips, parisc, sparc
#endif

namespace kvx::shm {

namespace {

// The uid a user namespace shows for a uid it does not map.
uid_t overflow_uid() {
    static const uid_t v = [] {
        unsigned long u = 65534;
        if (FILE *f = fopen("/proc/sys/kernel/overflowuid", "re")) {
            if (fscanf(f, "%lu", &u) != 1) u = 65534;
            fclose(f);
        }
        return static_cast<uid_t>(u);
    }();
    return v;
}

// pid is in our user namespace. Read through /proc while pidfd shows the
// process alive: the pid cannot name another process meanwhile. Without a
// pin, no.
bool same_user_namespace(pid_t pid, int pidfd) {
    if (pid <= 0 || pidfd < 0) return false;
    struct stat self, peer;
    const std::string path = strfmt("/proc/%d/ns/user", static_cast<int>(pid));
    if (stat("/proc/self/ns/user", &self) != 0 || stat(path.c_str(), &peer) != 0) return false;
    if (process_exited(pidfd)) return false;
    return self.st_dev == peer.st_dev && self.st_ino == peer.st_ino;
}

}  // namespace

bool peer_cred(int sock, PeerCred *out) {
    ucred c{};
    socklen_t len = sizeof c;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return false;
    out->uid = c.uid;
    out->pid = c.pid;
    out->who = strfmt("uid %u pid %d", static_cast<unsigned>(c.uid), static_cast<int>(c.pid));
    out->same_user = c.uid == geteuid();
    if (out->same_user && c.uid == overflow_uid()) {
        // Any user outside an unmapped namespace shows as this uid: only a
        // process in our own namespace is ours (others cannot enter it).
        net::Fd pin = pin_process(sock, c.pid);
        out->same_user = same_user_namespace(c.pid, pin.get());
        if (!out->same_user) out->who += " (not provably in our user namespace)";
    }
    return true;
}

net::Fd pin_process(int sock, pid_t pid, bool *exact) {
    int fd = -1;
    socklen_t len = sizeof fd;
    if (exact) *exact = false;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
        if (exact) *exact = true;
        return net::Fd(fd);
    }
    // A kernel that knows the option and refuses it says the peer is gone
    // (reaped): its pid may be another process's by now.
    if (errno != ENOPROTOOPT || pid <= 0) return net::Fd();
    return net::Fd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

uint64_t process_start_time(pid_t pid) {
    char buf[1024];
    const std::string path = strfmt("/proc/%d/stat", static_cast<int>(pid));
    FILE *f = fopen(path.c_str(), "re");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold anything, ')' included;
    // starttime is field 22, the 20th after the last ')'.
    const char *p = strrchr(buf, ')');
    if (!p) return 0;
    unsigned long long v = 0;
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &v) != 1) return 0;
    return v;
}

bool pinned_started_at(int pidfd, pid_t pid, uint64_t start_time) {
    return start_time != 0 && process_start_time(pid) == start_time && !process_exited(pidfd);
}

bool process_exited(int pidfd) {
    pollfd p{pidfd, POLLIN, 0};
    int rc;
    do {
        rc = poll(&p, 1, 0);
    } while (rc < 0 && errno == EINTR);
    return rc != 0;  // readable once it exited (an error: treat as gone)
}

std::array<uint8_t, 16> boot_id() {
    std::array<uint8_t, 16> id{};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return id;  // all zero: no peer is ever "on this host"
    char text[64] = {};
    const bool ok = fgets(text, sizeof text, f) != nullptr;
    fclose(f);
    size_t n = 0;
    for (const char *c = text; ok && *c && n < 32; c++) {
        int v = (*c >= '0' && *c <= '9') ? *c - '0' : (*c >= 'a' && *c <= 'f') ? *c - 'a' + 10 : -1;
        if (v < 0) continue;
        id[n / 2] = static_cast<uint8_t>(id[n / 2] | (n % 2 ? v : v << 4));
        n++;
    }
    return id;
}

uint64_t netns_inode() {
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

int send_msg(int fd, const void *buf, size_t n, int pass_fd) {
    iovec iov{const_cast<void *>(buf), n};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0) {
        mh.msg_control = ctl;
        mh.msg_controllen = sizeof ctl;
        cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    for (;;) {
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r == static_cast<ssize_t>(n)) return 0;
        if (r >= 0) return -EMSGSIZE;
        if (errno != EINTR) return -errno;
    }
}

ssize_t recv_msg(int fd, void *buf, size_t cap, int *got_fd) {
    *got_fd = -1;
    iovec iov{buf, cap};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ssize_t r;
    do {
        r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    // Every descriptor that came along is ours to close: keep the first only.
    for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0)) continue;
        const size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int f;
            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
            if (*got_fd < 0) *got_fd = f;
            else ::close(f);
        }
    }
    if (r == 0) return -ECONNRESET;
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return -EMSGSIZE;
    return r;
}

}  // namespace kvx::shm
