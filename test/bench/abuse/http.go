package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// oneToken is a chat completion of one token: the gateway's whole path (key, budget
// reservation, routing, the agent, a real runner) with the least inference.
const oneToken = `{"model":"` + deployName + `","max_tokens":1,"temperature":0,"messages":[{"role":"user","content":"Hi"}]}`

// requestTimeout bounds every request of the harness.
const requestTimeout = 30 * time.Second

// from is an HTTP client whose connections leave from the loopback address ip
// (Linux's loopback answers the whole 127/8): each request on a connection of its
// own, or kept alive and reused, up to conns to a host.
func from(ip string, keepAlive bool, conns int) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: requestTimeout, Transport: &http.Transport{DialContext: d.DialContext,
		DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}
}

// post sends body to the gateway at base's chat completions with key.
func post(ctx context.Context, c *http.Client, base, key, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	return do(c, req, key)
}

// do sends req with bearer and reads the whole answer.
func do(c *http.Client, req *http.Request, bearer string) (int, string, error) {
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// timed is post's latency: request sent to answer read whole, and whether it was a
// 200 (else what came instead).
func timed(ctx context.Context, c *http.Client, base, key string) (time.Duration, string) {
	start := time.Now()
	code, body, err := post(ctx, c, base, key, oneToken)
	d := time.Since(start)
	switch {
	case err != nil:
		return d, err.Error()
	case code != http.StatusOK:
		return d, fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
	}
	return d, ""
}

// latencies is a sample of request latencies and the failures beside them.
type latencies struct {
	D        []time.Duration
	Failed   int
	LastFail string
}

func (l *latencies) add(d time.Duration, fail string) {
	if fail != "" {
		l.Failed++
		l.LastFail = fail
		return
	}
	l.D = append(l.D, d)
}

// quantile is the nearest-rank q-quantile of the successful requests (0 with none).
func (l latencies) quantile(q float64) time.Duration {
	return quantile(l.D, q)
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// ms is d in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
