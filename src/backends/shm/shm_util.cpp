// Host identity and the datagram helpers of the shm backend's socket.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "backends/shm/shm.h"

namespace kvx::shm {

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
