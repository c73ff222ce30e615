// kvx_metrics_text(): a transport's counters and peers in the Prometheus
// text exposition format (0.0.4); docs/metrics.md lists the families.
#pragma once

#include <string>

#include "core/transport.h"

namespace kvx {

// Throws KVX_ENOTSUP without telemetry, KVX_ECLOSED after close.
std::string metrics_text(const Transport &t);

}  // namespace kvx
