package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Peer fetch through the gateway. A Mac that dials out fetches the prompt state of
// another Mac that dials out (a gateway's ticket naming both) through its own tunnel:
// it opens a stream toward the gateway with one line, "macfleet-peer/1 SOURCE", and
// the gateway joins that stream to a stream of SOURCE's tunnel only when it granted
// the fetch (Grant, when it signed the ticket), and answers "ok" or "refused: REASON";
// "none" when SOURCE holds no tunnel to it: the Mac dials SOURCE's address itself,
// and the gateway never dials an address for a Mac (an address a Mac wrote could
// name anything the gateway reaches). The gateway copies bytes and sees none of them:
// the Mac's TLS with SOURCE's agent runs inside, so SOURCE's agent still checks the
// fetching Mac's certificate and the ticket. Any other stream a Mac opens is closed
// unanswered.

// PeerProtocol is the first word of a Mac's line asking for a relay to a peer.
const PeerProtocol = "macfleet-peer/1"

// PeerRoute is how a Mac fetches prompt state from a peer, given whether each holds
// a tunnel to the gateway: through the gateway when both do (the gateway joins their
// tunnels); at the peer's address when the peer holds none, as before; not at all
// (ok false: no fetch is asked) from a peer that holds one by a Mac that holds none,
// which has no way to it.
func PeerRoute(sourceTunnel, targetTunnel bool) (viaGateway, ok bool) {
	return sourceTunnel && targetTunnel, targetTunnel || !sourceTunnel
}

// grant is a relay the gateway allows, until.
type grant struct {
	until time.Time
}

type grantKey struct{ target, source string }

// grants are the relays the gateway allows, by fetching Mac and peer.
type grants struct {
	mu sync.Mutex
	m  map[grantKey]grant
}

func (g *grants) add(target, source string, until, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[grantKey]grant{}
	}
	for k, v := range g.m {
		if !now.Before(v.until) {
			delete(g.m, k)
		}
	}
	k := grantKey{target, source}
	if old, ok := g.m[k]; ok && old.until.After(until) {
		until = old.until
	}
	g.m[k] = grant{until: until}
}

func (g *grants) get(target, source string) (grant, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, ok := g.m[grantKey{target, source}]
	return v, ok
}

// Link is a relay between two Macs that the fleet's objects call for while they
// exist, not for a ticket's while: a split replica's head dialing a worker shard's Mac,
// or a worker's Mac dialing the next worker's (SetLinks).
type Link struct{ From, To string }

// AdmitPeer decides a Mac's relay line: the peer it may reach, or why not. line is
// what target sent; g is the gateway's grant for target and the peer the line names,
// when found; linked whether a Link from target to that peer stands.
func AdmitPeer(target, line string, g grant, found, linked bool, now time.Time) (string, error) {
	source, ok := strings.CutPrefix(line, PeerProtocol+" ")
	switch {
	case !ok || source == "":
		return "", fmt.Errorf("the line names no peer (want %q)", PeerProtocol+" NODE")
	case source == target:
		return "", errors.New("a Mac fetches from another Mac, not from itself")
	case linked:
		return source, nil
	case !found:
		return "", fmt.Errorf("no gateway asked Mac %q to fetch from Mac %q, and no split replica links them", target, source)
	case !now.Before(g.until):
		return "", fmt.Errorf("the fetch from Mac %q that Mac %q was asked for expired at %s", source, target, g.until.Format(time.RFC3339))
	}
	return source, nil
}

// Grant lets target's tunnel reach source's until until: the gateway signed target a
// ticket to fetch from source. When target's tunnel is on another gateway replica the
// grant is given to that replica (Replicas.Grant), which joins target's stream; an
// error when it could not be.
func (s *Sessions) Grant(ctx context.Context, target, source string, until time.Time) error {
	if !s.Holds(target) && s.Replicas != nil && s.Replicas.Holds(target) {
		return s.Replicas.Grant(ctx, target, source, until)
	}
	s.grants.add(target, source, until, time.Now())
	return nil
}

// SetLinks replaces the standing relays (Link) with links: the gateway's routing
// table sets them from the split replicas it reads.
func (s *Sessions) SetLinks(links map[Link]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links = links
}

func (s *Sessions) linked(from, to string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.links[Link{from, to}]
}

// Holds says whether node holds a tunnel to this gateway now.
func (s *Sessions) Holds(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byNode[node]
	return sess != nil && !sess.IsClosed()
}

// serveStreams takes the streams node's agent opens: a granted relay to a peer is
// joined to it; anything else is closed.
func (s *Sessions) serveStreams(ctx context.Context, node string, sess *yamux.Session) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		wg.Go(func() { s.relay(ctx, node, stream{st}) })
	}
}

// relay reads a stream's line and joins it to the peer it names, or refuses.
func (s *Sessions) relay(ctx context.Context, node string, st net.Conn) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(HandshakeTimeout))
	line, err := readLine(st)
	if err != nil || !strings.HasPrefix(line, PeerProtocol+" ") {
		return // not a relay: closed unanswered
	}
	source, _ := strings.CutPrefix(line, PeerProtocol+" ")
	if source != node && !s.Reaches(source) {
		_, _ = io.WriteString(st, "none\n")
		return
	}
	g, found := s.grants.get(node, source)
	linked := s.linked(node, source)
	if _, err := AdmitPeer(node, line, g, found, linked, time.Now()); err != nil {
		s.Log.Info("Refused a relay to a peer", "node", node, "reason", err.Error())
		_, _ = io.WriteString(st, "refused: "+err.Error()+"\n")
		return
	}
	peer, err := s.dialAny(ctx, source)
	if err != nil {
		_, _ = io.WriteString(st, "refused: "+err.Error()+"\n")
		return
	}
	defer peer.Close()
	if _, err := io.WriteString(st, "ok\n"); err != nil {
		return
	}
	_ = st.SetDeadline(time.Time{})
	if linked {
		s.Log.V(2).Info("Relaying a split link", "node", node, "peer", source)
	} else {
		s.Log.V(2).Info("Relaying a peer fetch", "node", node, "peer", source)
	}
	join(st, peer)
}

// join copies a and b into each other until both directions end.
func join(a, b net.Conn) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Go(func() { half(a, b) })
	wg.Go(func() { half(b, a) })
	wg.Wait()
}

// DialPeer opens a connection to node's agent through this Mac's tunnel, which the
// gateway relays only when it asked this Mac to fetch from node; ErrNoSession while
// no tunnel is up, or when node holds none (this Mac dials it at its address).
func (a *Agent) DialPeer(ctx context.Context, node string) (net.Conn, error) {
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess == nil || sess.IsClosed() {
		return nil, ErrNoSession
	}
	c, err := sess.Open()
	if err != nil {
		return nil, fmt.Errorf("opening a stream to the gateway: %w", err)
	}
	st := stream{c}
	deadline := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = st.SetDeadline(deadline)
	answer, err := func() (string, error) {
		if _, err := io.WriteString(st, PeerProtocol+" "+node+"\n"); err != nil {
			return "", err
		}
		return readLine(st)
	}()
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("asking the gateway for Mac %q: %w", node, err)
	}
	switch answer {
	case "ok":
	case "none":
		st.Close()
		return nil, ErrNoSession
	default:
		st.Close()
		reason, _ := strings.CutPrefix(answer, "refused: ")
		return nil, &RefusedError{Reason: reason}
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// DialContext is a transport's dial for this Mac's peer fetches: through the tunnel
// to the Mac that nodeOf names in the request's context while a tunnel is up, else
// direct (the gateway, seeing no tunnel, asks for fetches this Mac dials itself).
func (a *Agent) DialContext(nodeOf func(context.Context) string, direct DialFunc) DialFunc {
	return dialVia(a.DialPeer, nodeOf, direct)
}
