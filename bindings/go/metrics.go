package kvxfer

import (
	"errors"
	"net/http"

	"kvxfer.dev/kvxfer/internal/capi"
)

// MetricsContentType is the content type of MetricsText: Prometheus text
// exposition format 0.0.4.
const MetricsContentType = "text/plain; version=0.0.4; charset=utf-8"

// MetricsText returns the transport's counters and peers as Prometheus text
// (exposition format 0.0.4, kvx_metrics_text; docs/metrics.md lists the
// families): transport totals (kvxfer_transfers_total{outcome}, failures by
// cause, bytes, in flight, peers by state, connects, a latency histogram in
// seconds) and the same per peer (label peer). Serve it on a /metrics
// endpoint (MetricsHandler) or hand it to a Prometheus client library.
//
// Errors: ErrClosed, ErrNotSupported (library built without telemetry).
func (t *Transport) MetricsText() (string, error) {
	const op = "MetricsText"
	n := make([]uint64, 1)
	var buf []byte
	for {
		err := t.do(op, func(h uintptr) int { return capi.Kvx_metrics_text(n, h, buf, int64(len(buf))) })
		if err == nil {
			return cString(buf), nil
		}
		if !errors.Is(err, ErrBufferTooSmall) {
			return "", err
		}
		// n[0] is the size with its NUL; the text may grow before the
		// next call: some more room, and again if that was not enough.
		buf = make([]byte, n[0]+n[0]/8+1024)
	}
}

// MetricsHandler returns an http.Handler serving t.MetricsText() with
// MetricsContentType, for a Prometheus scrape:
//
//	http.Handle("/metrics", kvxfer.MetricsHandler(t))
//
// It answers 503 Service Unavailable once t is closed, 500 on another
// failure, 405 to methods other than GET and HEAD.
func MetricsHandler(t *Transport) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		text, err := t.MetricsText()
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, ErrClosed) {
				code = http.StatusServiceUnavailable
			}
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", MetricsContentType)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write([]byte(text))
	})
}
