package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/macfleet/macfleet/test/support/localfleet"
)

// idleResult is the idle connections phase: the other client's latencies alone
// (before and after the attacks) and beside each attack.
type idleResult struct {
	Conns             int
	Alone, AloneAfter latencies
	Attacks           []idleAttack
}

// idleAttack is one attack: what it holds (Kind: idle connections from one address,
// stalled request bodies, or idle connections spread over Sources addresses), how
// its refused slots dial again (never, or after Redial), the other client's
// latencies beside it, and what the attacker got.
type idleAttack struct {
	Kind             string
	Conns, Sources   int
	Redial           time.Duration
	Attacked         latencies
	Held, MaxHeld    int64
	Attempts         int64
	Refused          int64
	ClosedByGateway  int64
	DialErrors       int64
	Failed           int64
	LastAttackerFail string
	// CPU is where the CPU went while the other client was measured.
	CPU cpuUse
}

// idlePhase measures the other client (127.0.0.2, a new connection per request)
// alone, then beside each attack of attacks on the gateway (idleAttacks), then alone
// again.
func idlePhase(ctx context.Context, o options, fl *benchFleet) (idleResult, error) {
	url, key := fl.urls[0], fl.keys[keyHot]
	pid, err := fl.f.GatewayPID(0)
	if err != nil {
		return idleResult{}, err
	}
	return attackPhase(ctx, o, "gateway", url, pid, func() (time.Duration, string) { return timed(ctx, from("127.0.0.2", false, 1), url, key) })
}

// idleAttacks are the attacks of a phase: o.idleConns idle connections from
// 127.0.0.1 whose refused slots never dial again, the same dialling again after
// o.redial (a flood of new connections besides the idle ones), o.idleConns stalled
// request bodies from 127.0.0.1, and o.spreadConns idle connections from
// o.spreadSources addresses.
func idleAttacks(o options) []idleAttack {
	return []idleAttack{{Kind: kindIdle, Conns: o.idleConns, Sources: 1}, {Kind: kindIdle, Conns: o.idleConns, Sources: 1, Redial: o.redial},
		{Kind: kindStalled, Conns: o.idleConns, Sources: 1, Redial: o.redial},
		{Kind: kindIdle, Conns: o.spreadConns, Sources: o.spreadSources, Redial: o.redial}}
}

// attackPhase measures one request of the other client (req) o.legit times alone,
// beside each of idleAttacks on url (served by process pid), and alone again.
func attackPhase(ctx context.Context, o options, name, url string, pid int, req func() (time.Duration, string)) (idleResult, error) {
	r := idleResult{Conns: o.idleConns}
	fmt.Fprintf(o.out, "idle (%s): %d requests alone; load %s\n", name, o.legit, localfleet.LoadAverage())
	for range o.legit {
		r.Alone.add(req())
	}
	for _, spec := range idleAttacks(o) {
		at, err := attackWith(ctx, o, spec, url, pid, func() (l latencies) {
			for range o.legit {
				l.add(req())
			}
			return l
		})
		if err != nil {
			return r, err
		}
		fmt.Fprintf(o.out, "idle (%s): p99 alone %s, beside %d %s from %d address(es) (refused ones dial again: %s) %s (%.2f×); "+
			"the attacker held %d (at most %d), %d refused, %d closed by the server, %d dial errors, %d other failures (the last: %s); %s\n",
			name, ms(r.Alone.quantile(0.99)), at.Conns, at.Kind, at.Sources, redialText(at.Redial), ms(at.Attacked.quantile(0.99)),
			ratio(at.Attacked.quantile(0.99), r.Alone.quantile(0.99)), at.Held, at.MaxHeld, at.Refused, at.ClosedByGateway, at.DialErrors, at.Failed, at.LastAttackerFail, at.CPU)
		r.Attacks = append(r.Attacks, at)
	}
	for range o.legit {
		r.AloneAfter.add(req())
	}
	return r, nil
}

// The kinds of attack.
const (
	kindIdle    = "idle connections"
	kindStalled = "stalled request bodies"
)

// attackWith runs measure beside the attack at on url (served by process pid) once
// each of its slots has tried once.
func attackWith(ctx context.Context, o options, at idleAttack, url string, pid int, measure func() latencies) (idleAttack, error) {
	a := &attacker{addr: strings.TrimPrefix(url, "http://"), redial: at.Redial, stop: make(chan struct{}),
		stalled: at.Kind == kindStalled, sources: at.Sources}
	a.start(at.Conns)
	defer a.end()
	deadline := time.Now().Add(2 * time.Minute)
	for a.attempts.Load() < int64(at.Conns) {
		if time.Now().After(deadline) {
			return at, fmt.Errorf("the attacker made %d of %d connections in 2 minutes", a.attempts.Load(), at.Conns)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return at, err
		}
	}
	fmt.Fprintf(o.out, "idle: the attacker holds %d %s from %d address(es) (%d refused so far; refused ones dial again: %s); %d requests beside it; load %s\n",
		a.held.Load(), at.Kind, at.Sources, a.refused.Load(), redialText(at.Redial), o.legit, localfleet.LoadAverage())
	before := sampleCPU(pid)
	at.Attacked = measure()
	at.CPU = sampleCPU(pid).since(before)
	at.Held, at.MaxHeld, at.Attempts = a.held.Load(), a.maxHeld.Load(), a.attempts.Load()
	at.Refused, at.ClosedByGateway, at.DialErrors, at.Failed = a.refused.Load(), a.closed.Load(), a.dialErrs.Load(), a.failed.Load()
	at.LastAttackerFail = a.lastFail()
	return at, nil
}

func redialText(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return "after " + d.String()
}

// attacker holds idle connections from 127.0.0.1: each slot dials, sends one
// GET /healthz kept alive, and then idles until the gateway closes the connection,
// and dials again a second later; a refused slot dials again after redial, or never
// when it is 0. A stalled attacker's slots send a chat completion's headers and the
// body's first byte, and never the rest. With sources above 1 slot i leaves from
// 127.0.0.(10 + i mod sources).
type attacker struct {
	addr    string
	redial  time.Duration
	stalled bool
	sources int
	stop    chan struct{}
	wg      sync.WaitGroup

	attempts, held, maxHeld, refused, closed, dialErrs, failed atomic.Int64

	mu   sync.Mutex
	fail string
}

// dialers bounds the dials in progress at once (the listen backlog is finite).
const dialers = 256

func (a *attacker) start(slots int) {
	sem := make(chan struct{}, dialers)
	for i := range slots {
		ip := "127.0.0.1"
		if a.sources > 1 {
			ip = fmt.Sprintf("127.0.0.%d", 10+i%a.sources)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		a.wg.Go(func() {
			for {
				sem <- struct{}{}
				c, ok, refused := a.open(d)
				<-sem
				wait := time.Second
				switch {
				case ok:
					a.idle(c)
				case refused && a.redial == 0:
					return
				case refused:
					wait = a.redial
				}
				select {
				case <-a.stop:
					return
				case <-time.After(wait):
				}
			}
		})
	}
}

// open dials and sends one GET /healthz; ok when the gateway answered (a 404, or a
// 401 with keys) and kept the connection alive; a 503 is a refusal.
func (a *attacker) open(d *net.Dialer) (c net.Conn, ok, refused bool) {
	select {
	case <-a.stop:
		return nil, false, false
	default:
	}
	a.attempts.Add(1)
	c, err := d.Dial("tcp", a.addr)
	if err != nil {
		a.dialErrs.Add(1)
		a.setFail(err.Error())
		return nil, false, false
	}
	if a.stalled {
		if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"Content-Length: 100000\r\n\r\n{"); err != nil {
			a.failed.Add(1)
			a.setFail(err.Error())
			c.Close()
			return nil, false, false
		}
		return c, true, false // held until the server answers or closes it
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	status, closed, err := healthz(c)
	_ = c.SetDeadline(time.Time{})
	switch {
	case err != nil:
		a.failed.Add(1)
		a.setFail(err.Error())
	case status == http.StatusServiceUnavailable:
		a.refused.Add(1)
		refused = true
	case !closed: // answered (the API listener has no /healthz) and kept alive
		return c, true, false
	default:
		a.failed.Add(1)
		a.setFail(fmt.Sprintf("GET /healthz: %d and the connection closed", status))
	}
	c.Close()
	return nil, false, refused
}

// idle holds c until the gateway answers or closes it, or the attack ends.
func (a *attacker) idle(c net.Conn) {
	n := a.held.Add(1)
	for m := a.maxHeld.Load(); n > m && !a.maxHeld.CompareAndSwap(m, n); m = a.maxHeld.Load() {
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Read(make([]byte, 1)) // nothing comes: returns when closed
	}()
	select {
	case <-done:
		a.closed.Add(1)
	case <-a.stop:
	}
	c.Close()
	<-done
	a.held.Add(-1)
}

func (a *attacker) end() {
	close(a.stop)
	a.wg.Wait()
}

func (a *attacker) setFail(s string) {
	a.mu.Lock()
	a.fail = s
	a.mu.Unlock()
}

func (a *attacker) lastFail() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fail
}

// healthz sends GET /healthz on c, asking to keep it alive, and reads the answer:
// its status and whether the server closes the connection after it.
func healthz(c net.Conn) (status int, closed bool, err error) {
	if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"); err != nil {
		return 0, false, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Close, err
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
