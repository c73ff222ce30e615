// A test-only backend, "instant": a transfer is done inside submit(), so a
// program that links it measures the core's own cost per call and per block
// (no network, no other thread). Never shipped: the library's registry holds
// a weak reference, kvx_backend_test, that only a test program defines.
#pragma once

namespace kvx::instant {

// While set, submitted transfers stay in flight (to measure the core with
// many of them outstanding); they end when their peer is removed.
void hold(bool on);
// Each submit() first sleeps this long (0: not at all), to race a remove.
void submit_delay_ms(int ms);
// Held transfers of every peer complete now, done.
void release();
// Peers (links) connected and not yet destroyed.
int live_peers();

}  // namespace kvx::instant
