// Wall-clock time for telemetry and receive timestamps.
#pragma once

#include <time.h>

#include <cstdint>

namespace kvx {

// CLOCK_REALTIME in nanoseconds since the epoch.
inline int64_t realtime_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace kvx
