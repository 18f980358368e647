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

// idleAttack is one attack: how its refused slots dial again (never, or after
// Redial), the other client's latencies beside it, and what the attacker got.
type idleAttack struct {
	Redial           time.Duration
	Attacked         latencies
	Held, MaxHeld    int64
	Attempts         int64
	Refused          int64
	ClosedByGateway  int64
	DialErrors       int64
	Failed           int64
	LastAttackerFail string
}

// idlePhase measures the other client (127.0.0.2, a new connection per request)
// alone, then beside an attacker at 127.0.0.1 that opens o.idleConns idle
// connections to the same gateway and keeps those it gets (dialling again when the
// gateway closes one), then beside one whose refused slots also dial again after
// o.redial (a flood of new connections besides the idle ones), then alone again.
func idlePhase(ctx context.Context, o options, fl *benchFleet) (idleResult, error) {
	r := idleResult{Conns: o.idleConns}
	url, key := fl.urls[0], fl.keys[keyHot]
	legit := from("127.0.0.2", false, 1)
	fmt.Fprintf(o.out, "idle: %d requests alone; load %s\n", o.legit, localfleet.LoadAverage())
	for range o.legit {
		r.Alone.add(timed(ctx, legit, url, key))
	}
	for _, redial := range []time.Duration{0, o.redial} {
		at, err := attack(ctx, o, url, redial, func() (l latencies) {
			for range o.legit {
				l.add(timed(ctx, legit, url, key))
			}
			return l
		})
		if err != nil {
			return r, err
		}
		fmt.Fprintf(o.out, "idle: p99 alone %s, beside %d idle connections (refused ones dial again: %s) %s (%.2f×); "+
			"the attacker held %d (at most %d), %d refused, %d closed by the gateway, %d dial errors, %d other failures (the last: %s)\n",
			ms(r.Alone.quantile(0.99)), o.idleConns, redialText(redial), ms(at.Attacked.quantile(0.99)),
			ratio(at.Attacked.quantile(0.99), r.Alone.quantile(0.99)), at.Held, at.MaxHeld, at.Refused, at.ClosedByGateway, at.DialErrors, at.Failed, at.LastAttackerFail)
		r.Attacks = append(r.Attacks, at)
	}
	for range o.legit {
		r.AloneAfter.add(timed(ctx, legit, url, key))
	}
	return r, nil
}

// attack runs measure beside an attacker on addr once each of its o.idleConns slots
// has tried once.
func attack(ctx context.Context, o options, url string, redial time.Duration, measure func() latencies) (idleAttack, error) {
	at := idleAttack{Redial: redial}
	a := &attacker{addr: strings.TrimPrefix(url, "http://"), redial: redial, stop: make(chan struct{})}
	a.start(o.idleConns)
	defer a.end()
	deadline := time.Now().Add(2 * time.Minute)
	for a.attempts.Load() < int64(o.idleConns) {
		if time.Now().After(deadline) {
			return at, fmt.Errorf("the attacker made %d of %d connections in 2 minutes", a.attempts.Load(), o.idleConns)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return at, err
		}
	}
	fmt.Fprintf(o.out, "idle: the attacker holds %d connections (%d refused so far; refused ones dial again: %s); %d requests beside it; load %s\n",
		a.held.Load(), a.refused.Load(), redialText(redial), o.legit, localfleet.LoadAverage())
	at.Attacked = measure()
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
// when it is 0.
type attacker struct {
	addr   string
	redial time.Duration
	stop   chan struct{}
	wg     sync.WaitGroup

	attempts, held, maxHeld, refused, closed, dialErrs, failed atomic.Int64

	mu   sync.Mutex
	fail string
}

// dialers bounds the dials in progress at once (the listen backlog is finite).
const dialers = 256

func (a *attacker) start(slots int) {
	sem := make(chan struct{}, dialers)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 5 * time.Second}
	for range slots {
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

// idle holds c until the gateway closes it or the attack ends.
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
