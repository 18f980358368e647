package server

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// GatewayQueueTTL is how long a gateway's report of its queue counts: a gateway that
// sends nothing more to a replica for this long is taken to have nothing waiting.
const GatewayQueueTTL = 10 * time.Second

// maxGatewaysPerModel bounds what one model keeps (the oldest report goes).
const maxGatewaysPerModel = 64

// GatewayQueue is what one gateway last said of its queue for a model's deployment
// (headers v1alpha1.HeaderQueued and HeaderGateway on a request it forwarded).
type GatewayQueue struct {
	Gateway string `json:"gateway"`
	Queued  int32  `json:"queued"`
	// QueuedSeconds is the integral of the queue's length over time the gateway
	// reported with it (v1alpha1.HeaderQueuedSeconds); nil from a gateway that does
	// not send it.
	QueuedSeconds *float64  `json:"queuedSeconds,omitempty"`
	At            time.Time `json:"at"`
}

// gatewayQueues keeps the latest GatewayQueue per model and gateway.
type gatewayQueues struct {
	mu sync.Mutex
	m  map[string]map[string]GatewayQueue
}

// observe records the queue a forwarded request reports for model; a request without
// the headers, or with a value that is not a count, records nothing. A queued-seconds
// value that is not a finite non-negative number is left out of the report.
func (q *gatewayQueues) observe(r *http.Request, model string, now time.Time) {
	gw := r.Header.Get(v1alpha1.HeaderGateway)
	v := r.Header.Get(v1alpha1.HeaderQueued)
	if gw == "" || v == "" || len(gw) > 64 {
		return
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[string]map[string]GatewayQueue{}
	}
	byGW := q.m[model]
	if byGW == nil {
		byGW = map[string]GatewayQueue{}
		q.m[model] = byGW
	}
	if _, ok := byGW[gw]; !ok && len(byGW) >= maxGatewaysPerModel {
		oldest := ""
		for k, e := range byGW {
			if oldest == "" || e.At.Before(byGW[oldest].At) {
				oldest = k
			}
		}
		delete(byGW, oldest)
	}
	e := GatewayQueue{Gateway: gw, Queued: int32(n), At: now}
	if s, err := strconv.ParseFloat(r.Header.Get(v1alpha1.HeaderQueuedSeconds), 64); err == nil && s >= 0 && !math.IsInf(s, 0) {
		e.QueuedSeconds = &s
	}
	byGW[gw] = e
}

// snapshot returns the reports younger than GatewayQueueTTL, per model, and forgets
// the older ones.
func (q *gatewayQueues) snapshot(now time.Time) map[string][]GatewayQueue {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out map[string][]GatewayQueue
	for model, byGW := range q.m {
		for k, e := range byGW {
			if now.Sub(e.At) >= GatewayQueueTTL {
				delete(byGW, k)
				continue
			}
			if out == nil {
				out = map[string][]GatewayQueue{}
			}
			out[model] = append(out[model], e)
		}
		if len(byGW) == 0 {
			delete(q.m, model)
		}
	}
	return out
}
