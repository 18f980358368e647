package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/internal/pki"
)

// Several gateway replicas. A Mac that dials out holds its tunnel to one replica:
// whichever the tunnel address (a load balancer) reached. The other replicas reach
// that Mac through it. Each replica reads the others' lists of Macs every
// ListInterval (a line "macfleet-tunnels/1", answered "ok NODE NODE ..."), and dials a
// Mac another replica holds with the manager's relay line, showing its own
// certificate. A replica joins a gateway's relay only to a tunnel it holds itself, so
// a call crosses at most two replicas and never loops; it joins the manager's relay
// through another replica as well, so the manager may reach any replica.

// ListProtocol is the line a gateway replica asks another's list of Macs with.
const ListProtocol = "macfleet-tunnels/1"

// GrantProtocol is the line a gateway replica gives another the grant of a peer fetch
// with: "macfleet-grant/1 TARGET SOURCE UNTIL" (UNTIL in Unix milliseconds), for a
// fetching Mac (TARGET) whose tunnel the other holds; answered "ok".
const GrantProtocol = "macfleet-grant/1"

// ListInterval is how often a replica reads the other replicas' lists.
const ListInterval = 2 * time.Second

// maxList bounds a list's answer (about 20,000 Mac names).
const maxList = 1 << 20

// listTimeout bounds one read of a replica's list, its handshake included.
const listTimeout = 5 * time.Second

// AdmitReplica decides whether a caller may read the list of Macs holding a tunnel
// or give a grant: only another gateway replica, with its certificate.
func AdmitReplica(id pki.Identity, hasCert bool) error {
	switch {
	case !hasCert:
		return errors.New("no client certificate: only a gateway replica reads the Macs' tunnels or grants their fetches")
	case id.Kind != pki.KindGateway:
		return fmt.Errorf("the certificate is a %s's (%s): only a gateway replica reads the Macs' tunnels or grants their fetches", id.Kind, id.Name)
	}
	return nil
}

// ParseGrant reads a grant line's fields after GrantProtocol: the fetching Mac, the
// Mac it fetches from, and until when.
func ParseGrant(fields string) (target, source string, until time.Time, err error) {
	f := strings.Fields(fields)
	if len(f) != 3 {
		return "", "", time.Time{}, fmt.Errorf("want %q", GrantProtocol+" TARGET SOURCE UNTIL_UNIX_MS")
	}
	ms, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || ms <= 0 {
		return "", "", time.Time{}, fmt.Errorf("until %q is not Unix milliseconds", f[2])
	}
	return f[0], f[1], time.UnixMilli(ms), nil
}

// Replicas are the other gateway replicas' tunnel listeners, and which Macs hold
// their tunnel to each.
type Replicas struct {
	// Addrs are the replicas' tunnel listeners, host:port; each address a host
	// resolves to is a replica (a headless Service names every pod). This replica's
	// own address may be among them: it lists its own Macs, which Sessions dials
	// first.
	Addrs []string
	// Certificates are this gateway's certificate and the fleet's CA bundle.
	Certificates *pki.Source
	// Every is how often the lists are read (ListInterval when zero).
	Every time.Duration
	// LookupHost resolves a host (net.DefaultResolver's when nil).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	Log        logr.Logger

	mu    sync.Mutex
	where map[string]string // Mac → the replica address that holds its tunnel
}

// Run reads the replicas' lists until ctx ends.
func (r *Replicas) Run(ctx context.Context) {
	every := r.Every
	if every <= 0 {
		every = ListInterval
	}
	for {
		r.refresh(ctx)
		if !sleep(ctx, every) {
			return
		}
	}
}

// refresh reads every replica's list, each within listTimeout, and replaces the map.
// A replica that does not answer keeps none of its Macs: a request for one goes to
// its address as for any Mac, and fails there as it would have.
func (r *Replicas) refresh(ctx context.Context) {
	addrs := r.resolve(ctx)
	lists := make([][]string, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			lctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			nodes, err := r.list(lctx, addr)
			if err != nil {
				r.Log.V(1).Info("Reading another gateway replica's tunnels failed", "replica", addr, "reason", err.Error())
			}
			lists[i] = nodes
		})
	}
	wg.Wait()
	where := PlaceMacs(addrs, lists)
	r.mu.Lock()
	changed := !maps.Equal(r.where, where)
	r.where = where
	r.mu.Unlock()
	if changed {
		r.Log.V(1).Info("Macs that hold their tunnel to another gateway replica", "macs", len(where), "replicas", len(addrs))
	}
}

// PlaceMacs maps each Mac of lists (lists[i] the Macs whose tunnel addrs[i] holds) to
// the replica that holds it; a Mac two replicas list (one reconnected, the other has
// not yet seen its old tunnel close) goes to the later one in addrs' order, which is
// stable between reads.
func PlaceMacs(addrs []string, lists [][]string) map[string]string {
	where := map[string]string{}
	for i, nodes := range lists {
		for _, n := range nodes {
			where[n] = addrs[i]
		}
	}
	return where
}

// CheckReplicaAddrs refuses a replica address that is not host:port with a port
// number, naming it: it could never be dialed.
func CheckReplicaAddrs(addrs []string) error {
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return fmt.Errorf("gateway replica address %q: want HOST:PORT (a headless Service's name and the tunnel port, for instance)", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("gateway replica address %q: the port %q is not a port number", a, port)
		}
	}
	return nil
}

// resolve expands Addrs to one address per replica, sorted; a host that does not
// resolve is logged and skipped.
func (r *Replicas) resolve(ctx context.Context) []string {
	lookup := r.LookupHost
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	var out []string
	for _, a := range r.Addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue // CheckReplicaAddrs refused it at the start
		}
		if net.ParseIP(host) != nil {
			out = append(out, a)
			continue
		}
		ips, err := lookup(ctx, host)
		if err != nil {
			r.Log.V(1).Info("Resolving the gateway replicas failed", "host", host, "reason", err.Error())
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// list asks the replica at addr which Macs hold their tunnel to it.
func (r *Replicas) list(ctx context.Context, addr string) ([]string, error) {
	c, err := r.dial(ctx, addr, ListProtocol)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	b, err := io.ReadAll(io.LimitReader(c, maxList+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxList {
		return nil, fmt.Errorf("its list is longer than %d bytes", maxList)
	}
	return ParseList(string(b))
}

// ParseList reads a list's answer: "ok" and the Macs' names, or "refused: REASON".
func ParseList(answer string) ([]string, error) {
	answer = strings.TrimSuffix(answer, "\n")
	if reason, ok := strings.CutPrefix(answer, "refused: "); ok {
		return nil, &RefusedError{Reason: reason}
	}
	rest, ok := strings.CutPrefix(answer, "ok")
	if !ok || (rest != "" && rest[0] != ' ') {
		return nil, fmt.Errorf("unexpected answer %.80q", answer)
	}
	return strings.Fields(rest), nil
}

// dial opens a TLS connection to the replica at addr with this gateway's certificate
// and sends line.
func (r *Replicas) dial(ctx context.Context, addr, line string) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: HandshakeTimeout}, Config: gatewayClientConfig(r.Certificates)}
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	c, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing the gateway replica at %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Holds says whether another replica listed node at the last read.
func (r *Replicas) Holds(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.where[node]
	return ok
}

// Dial opens a connection to node's agent through the replica that holds its tunnel;
// ErrNoSession when no replica listed it.
func (r *Replicas) Dial(ctx context.Context, node string) (net.Conn, error) {
	r.mu.Lock()
	addr := r.where[node]
	r.mu.Unlock()
	if addr == "" {
		return nil, ErrNoSession
	}
	return (&Relay{Gateway: addr, Certificates: r.Certificates}).Dial(ctx, node)
}

// Grant gives the replica that holds target's tunnel the grant to join target's
// stream to source (this replica signed target's ticket).
func (r *Replicas) Grant(ctx context.Context, target, source string, until time.Time) error {
	r.mu.Lock()
	addr := r.where[target]
	r.mu.Unlock()
	if addr == "" {
		return ErrNoSession
	}
	c, err := r.dial(ctx, addr, fmt.Sprintf("%s %s %s %d", GrantProtocol, target, source, until.UnixMilli()))
	if err != nil {
		return err
	}
	defer c.Close()
	answer, err := readLine(c)
	switch {
	case err != nil:
		return fmt.Errorf("giving the replica at %s the grant of %s: %w", addr, target, err)
	case answer != "ok":
		reason, _ := strings.CutPrefix(answer, "refused: ")
		return &RefusedError{Reason: reason}
	}
	return nil
}
