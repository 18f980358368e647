package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/yamux"

	"github.com/macfleet/macfleet/internal/pki"
)

// Sessions is the gateway's half: the tunnels the Macs hold to it, by Mac. A Mac's
// newer tunnel replaces its older one (an agent that reconnected).
type Sessions struct {
	// Certificates are the gateway's certificate for the agents and the fleet's CA
	// bundle.
	Certificates *pki.Source
	Log          logr.Logger
	// ProbeWait is how long a probe may take, and when one that failed is answered
	// (ProbeTimeout when zero).
	ProbeWait time.Duration
	// Replicas, when there are several gateway replicas, are the others: a Mac whose
	// tunnel another replica holds is dialed through it.
	Replicas *Replicas

	mu     sync.Mutex
	byNode map[string]*yamux.Session
	grants grants
	links  map[Link]bool
}

// Serve accepts tunnels on ln until ctx ends, then closes ln and every tunnel.
func (s *Sessions) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		s.closeAll()
	})
	defer stop()
	// Serve returns once every tunnel it accepted has closed.
	var wg sync.WaitGroup
	defer wg.Wait()
	tl := tls.NewListener(ln, s.Certificates.ServerConfig())
	for {
		c, err := tl.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accepting tunnels: %w", err)
		}
		wg.Go(func() { s.accept(ctx, c.(*tls.Conn)) })
	}
}

// accept checks a connection's certificate against its opening line and holds its
// tunnel until it closes.
func (s *Sessions) accept(ctx context.Context, c *tls.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	o, err := s.open(ctx, c)
	if err != nil {
		s.Log.Info("Refused a tunnel", "remote", c.RemoteAddr().String(), "reason", err.Error())
		c.Close()
		return
	}
	node := o.node
	switch {
	case o.granted:
		c.Close()
		return
	case o.list:
		s.answerList(c)
		return
	case o.relay:
		s.relayCaller(ctx, c, node, o.throughReplicas)
		return
	case o.probe != "":
		s.probe(ctx, c, node, o.probe)
		return
	}
	sess, err := yamux.Client(c, sessionConfig(logWriter{s.Log}))
	if err != nil {
		s.Log.Error(err, "Starting a tunnel", "node", node)
		c.Close()
		return
	}
	s.add(node, sess)
	s.Log.Info("Mac connected by tunnel", "node", node, "remote", c.RemoteAddr().String())
	go s.serveStreams(ctx, node, sess)
	<-sess.CloseChan()
	s.remove(node, sess)
	s.Log.Info("Mac's tunnel closed", "node", node)
}

// opening is what a connection's opening line asks for: node's tunnel; with relay,
// the manager's or another replica's relay to node (throughReplicas: the manager's,
// which may go on through another replica); with probe, whether node's agent answers
// at that address; with list, which Macs hold a tunnel here; granted, another
// replica's grant was taken (answered).
type opening struct {
	node            string
	relay           bool
	throughReplicas bool
	probe           string
	list            bool
	granted         bool
}

// open runs the handshake and the opening exchange, and answers a tunnel's ok or why
// not; the answers to a relay or a probe are relayCaller's and probe's.
func (s *Sessions) open(ctx context.Context, c *tls.Conn) (opening, error) {
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	if err := c.HandshakeContext(hctx); err != nil {
		return opening{}, fmt.Errorf("TLS handshake: %w", err)
	}
	line, err := readLine(c)
	if err != nil {
		return opening{}, fmt.Errorf("reading the opening line: %w", err)
	}
	cs := c.ConnectionState()
	id, hasCert := pki.PeerIdentity(&cs)
	refuse := func(err error) (opening, error) {
		_, _ = io.WriteString(c, "refused: "+err.Error()+"\n")
		return opening{}, err
	}
	if target, ok := strings.CutPrefix(line, RelayProtocol+" "); ok {
		if err := AdmitRelay(id, hasCert, target); err != nil {
			return refuse(err)
		}
		return opening{node: target, relay: true, throughReplicas: id.Kind == pki.KindManager}, nil
	}
	if line == ListProtocol {
		if err := AdmitReplica(id, hasCert); err != nil {
			return refuse(err)
		}
		return opening{list: true}, nil
	}
	if fields, ok := strings.CutPrefix(line, GrantProtocol+" "); ok {
		if err := AdmitReplica(id, hasCert); err != nil {
			return refuse(err)
		}
		target, source, until, err := ParseGrant(fields)
		if err != nil {
			return refuse(err)
		}
		s.grants.add(target, source, until, time.Now())
		_, _ = io.WriteString(c, "ok\n")
		return opening{granted: true}, nil
	}
	if addr, ok := strings.CutPrefix(line, ProbeProtocol+" "); ok {
		// A probe names no Mac: it is about the Mac the certificate names.
		node, err := Admit(id, hasCert, id.Name)
		if err != nil {
			return refuse(err)
		}
		if addr == "" {
			return refuse(fmt.Errorf("the probe names no address (want %q)", ProbeProtocol+" HOST:PORT"))
		}
		return opening{node: node, probe: addr}, nil
	}
	claim, ok := strings.CutPrefix(line, Protocol+" ")
	if !ok {
		claim = ""
	}
	node, err := Admit(id, hasCert, claim)
	if err != nil {
		return refuse(err)
	}
	if _, err := io.WriteString(c, "ok\n"); err != nil {
		return opening{}, err
	}
	_ = c.SetDeadline(time.Time{})
	return opening{node: node}, nil
}

// readLine reads one line of at most maxLine bytes a byte at a time, so that nothing
// after it (the multiplexer's frames) is consumed.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for b.Len() < maxLine {
		if _, err := io.ReadFull(r, one); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(one[0])
	}
	return "", fmt.Errorf("longer than %d bytes", maxLine)
}

func (s *Sessions) add(node string, sess *yamux.Session) {
	s.mu.Lock()
	if s.byNode == nil {
		s.byNode = map[string]*yamux.Session{}
	}
	old := s.byNode[node]
	s.byNode[node] = sess
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

func (s *Sessions) remove(node string, sess *yamux.Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byNode[node] == sess {
		delete(s.byNode, node)
	}
}

func (s *Sessions) closeAll() {
	s.mu.Lock()
	all := s.byNode
	s.byNode = nil
	s.mu.Unlock()
	for _, sess := range all {
		sess.Close()
	}
}

// Nodes are the Macs holding a tunnel now, sorted.
func (s *Sessions) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ns []string
	for n, sess := range s.byNode {
		if !sess.IsClosed() {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	return ns
}

// Dial opens a stream to node's agent through its tunnel; ErrNoSession when it
// holds none.
func (s *Sessions) Dial(node string) (net.Conn, error) {
	s.mu.Lock()
	sess := s.byNode[node]
	s.mu.Unlock()
	if sess == nil || sess.IsClosed() {
		return nil, ErrNoSession
	}
	c, err := sess.Open()
	if err != nil {
		return nil, fmt.Errorf("opening a stream in the tunnel of %s: %w", node, err)
	}
	return stream{c}, nil
}

// dialAny opens a stream to node's agent through its tunnel here, else through the
// replica that holds it; ErrNoSession when neither does.
func (s *Sessions) dialAny(ctx context.Context, node string) (net.Conn, error) {
	c, err := s.Dial(node)
	if errors.Is(err, ErrNoSession) && s.Replicas != nil {
		return s.Replicas.Dial(ctx, node)
	}
	return c, err
}

// Reaches says whether node holds a tunnel to this gateway or to another replica.
func (s *Sessions) Reaches(node string) bool {
	return s.Holds(node) || (s.Replicas != nil && s.Replicas.Holds(node))
}

// answerList answers another replica's list line: "ok" and the Macs holding a tunnel
// here.
func (s *Sessions) answerList(c net.Conn) {
	defer c.Close()
	_, _ = io.WriteString(c, strings.Join(append([]string{"ok"}, s.Nodes()...), " ")+"\n")
}

// DialContext is a transport's dial: through the tunnel of the Mac that nodeOf names
// in the request's context when it holds one here or to another replica, else direct.
func (s *Sessions) DialContext(nodeOf func(context.Context) string, direct DialFunc) DialFunc {
	return dialVia(s.dialAny, nodeOf, direct)
}

// logWriter sends yamux's log lines to a logr.Logger.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(2).Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
