package splitlink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
)

// DefaultDialTimeout bounds the worker agent's dial of its local worker, and the head
// agent's opening of a link.
const DefaultDialTimeout = 5 * time.Second

// Error codes of a refused link.
const (
	CodeForbidden    = "forbidden_caller"
	CodeUnavailable  = "split_worker_unavailable"
	CodeNotALink     = "split_upgrade_required"
	typePermission   = "permission_error"
	codeNotFoundPath = "not_found"
)

// Lookup finds replica namespace/name among the replicas with a worker shard on this
// Mac (nil when there is none of that name), and the local worker serving that shard
// (a zero Worker while it is not running).
type Lookup func(ctx context.Context, namespace, name string) (mr *v1alpha1.ModelReplica, worker Worker)

// Worker is a local worker process: the loopback address it listens on and the
// secret every connection to it must open with (runnerapi.SplitAuthFrame; nil for a
// worker started without one).
type Worker struct {
	Addr   string
	Secret []byte
}

// Handler is the worker Mac's side: it accepts a link on Path from the head's Mac
// (Authorize) and pipes it to the local worker. It reads the caller's identity from the
// client certificate the agent's TLS listener checked against the fleet CA; a request
// without one (an API key, a tenant's token) is refused.
type Handler struct {
	// Self is this Mac's MacNode name.
	Self   string
	Lookup Lookup
	// DialTimeout: see DefaultDialTimeout.
	DialTimeout time.Duration
	Log         logr.Logger
}

// ServeHTTP answers one link request: 101 Switching Protocols and then the worker's
// bytes, or an OpenAI-style error.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lr, ok := admitLink(w, r)
	if !ok {
		return
	}
	mr, wk := h.Lookup(r.Context(), lr.ns, lr.name)
	addr := wk.Addr
	authorize := Authorize
	if lr.peer {
		authorize = AuthorizePeer
	}
	if err := authorize(mr, h.Self, lr.caller.Name); err != nil {
		h.Log.Info("Refused a split link", "caller", lr.caller.String(), "replica", lr.replica(), "why", err.Error())
		refuse(w, http.StatusForbidden, typePermission, CodeForbidden, err.Error())
		return
	}
	if addr == "" {
		refuse(w, http.StatusServiceUnavailable, openaierr.TypeUnavailable, CodeUnavailable,
			"the worker of replica "+lr.replica()+" on "+h.Self+" is not running yet")
		return
	}
	timeout := h.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	// The worker serves nothing before the secret: the caller's certificate was
	// checked above, and only this agent holds it.
	worker, err := DialWorker(r.Context(), wk, timeout)
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, openaierr.TypeUnavailable, CodeUnavailable,
			"the worker of replica "+lr.replica()+" on "+h.Self+" is unreachable: "+err.Error())
		return
	}
	client, ok := switchProtocols(w, worker)
	if !ok {
		return
	}
	if lr.peer && !h.relayPeerHello(client, worker, lr, timeout) {
		return
	}
	h.Log.V(1).Info("Opened a split link", "caller", lr.caller.Name, "replica", lr.replica(), "worker", addr, "peer", lr.peer)
	guard := func(dst io.Writer, src io.Reader) error { return Guard(dst, src, shardMemory(mr, h.Self)) }
	if lr.peer {
		guard = GuardPushes
	}
	if err := pipeGuarded(client, worker, guard); err != nil {
		h.Log.Info("Closed a split link on a refused frame", "caller", lr.caller.String(), "replica", lr.replica(), "why", err.Error())
		return
	}
	h.Log.V(1).Info("Closed a split link", "caller", lr.caller.Name, "replica", lr.replica())
}

// linkRequest is what a link request names: the replica, whether it asks for a peer
// link (from the previous worker's Mac), and the caller's certificate identity.
type linkRequest struct {
	ns, name string
	peer     bool
	caller   pki.Identity
}

// replica is the link's replica as namespace/name.
func (lr linkRequest) replica() string { return lr.ns + "/" + lr.name }

// admitLink checks a request's path, caller certificate and upgrade headers, refusing
// it (false) when one is wrong.
func admitLink(w http.ResponseWriter, r *http.Request) (linkRequest, bool) {
	ns, name, peer, ok := parsePath(r.URL.EscapedPath())
	if !ok {
		refuse(w, http.StatusNotFound, openaierr.TypeInvalidRequest, codeNotFoundPath, "no such endpoint: "+r.Method+" "+r.URL.Path)
		return linkRequest{}, false
	}
	id, hasCert := pki.PeerIdentity(r.TLS)
	if !hasCert || id.Kind != pki.KindNode {
		who := "a caller without a Mac's certificate"
		if hasCert {
			who = "the certificate of " + id.String()
		}
		refuse(w, http.StatusForbidden, typePermission, CodeForbidden,
			who+" may not open a split link: only the Mac of the replica's head may, with its fleet certificate")
		return linkRequest{}, false
	}
	if r.Method != http.MethodGet || !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), Protocol) {
		refuse(w, http.StatusUpgradeRequired, openaierr.TypeInvalidRequest, CodeNotALink,
			"a split link is a GET with Connection: Upgrade and Upgrade: "+Protocol)
		return linkRequest{}, false
	}
	return linkRequest{ns: ns, name: name, peer: peer, caller: id}, true
}

// switchProtocols takes the connection over from the HTTP server and answers 101
// Switching Protocols on it; on failure it closes the worker's connection too (false).
func switchProtocols(w http.ResponseWriter, worker net.Conn) (*bufferedConn, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		worker.Close()
		refuse(w, http.StatusInternalServerError, openaierr.TypeServer, openaierr.CodeInternal, "the agent cannot hand over this connection: "+err.Error())
		return nil, false
	}
	// The server's deadlines for the request stay on a hijacked connection.
	_ = conn.SetDeadline(time.Time{})
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		worker.Close()
		return nil, false
	}
	return &bufferedConn{Conn: conn, r: brw.Reader}, true
}

// relayPeerHello passes a peer link's greeting on to the worker: the previous worker's
// Mac may greet the worker as its peer, nothing else (a runner's session opened on a
// peer link would be a second head). It closes both connections when it fails (false).
func (h *Handler) relayPeerHello(client *bufferedConn, worker net.Conn, lr linkRequest, timeout time.Duration) bool {
	hello, err := readPeerHello(client, timeout)
	if err == nil {
		_, err = worker.Write(hello)
	}
	if err != nil {
		h.Log.Info("Closed a peer link", "caller", lr.caller.String(), "replica", lr.replica(), "why", err.Error())
		client.Conn.Close()
		worker.Close()
		return false
	}
	return true
}

// DialWorker connects to the local worker wk within timeout and authenticates the
// connection with its secret (runnerapi.SplitAuthFrame), when it has one.
func DialWorker(ctx context.Context, wk Worker, timeout time.Duration) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", wk.Addr)
	if err != nil || wk.Secret == nil {
		return c, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(runnerapi.SplitAuthFrame(wk.Secret)); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// shardMemory is the memory of node's worker shard of mr (0 when it has none).
func shardMemory(mr *v1alpha1.ModelReplica, node string) uint64 {
	if mr == nil || mr.Spec.Split == nil {
		return 0
	}
	for _, s := range mr.Spec.Split.Shards {
		if s.Node == node {
			return uint64(max(s.Memory.Value(), 0))
		}
	}
	return 0
}

// pipeGuarded copies bytes both ways between the caller and the worker, the caller's
// through guard, until either side ends; it returns guard's refusal (a *FrameError),
// if that is what ended it.
func pipeGuarded(caller, worker net.Conn, guard func(dst io.Writer, src io.Reader) error) error {
	refused := make(chan error, 1)
	done := make(chan struct{}, 2)
	go func() {
		err := guard(worker, caller)
		var fe *FrameError
		if errors.As(err, &fe) {
			refused <- err
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(caller, worker)
		done <- struct{}{}
	}()
	<-done
	caller.Close()
	worker.Close()
	<-done
	select {
	case err := <-refused:
		return err
	default:
		return nil
	}
}

func refuse(w http.ResponseWriter, status int, typ, code, msg string) {
	(&openaierr.Error{Status: status, Type: typ, Code: code, Message: msg}).Write(w)
}

// headerHas reports whether a comma-separated header of h lists token (any case).
func headerHas(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for part := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

// readPeerHello reads the first frame of a peer link, within timeout, and returns its
// bytes if it is the worker protocol's peer greeting (runnerapi.SplitPeerHello with a
// session id), else an error naming what came instead.
func readPeerHello(c net.Conn, timeout time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	frame := make([]byte, 5+runnerapi.SplitPeerSessionBytes)
	if _, err := io.ReadFull(c, frame[:5]); err != nil {
		return nil, fmt.Errorf("no peer greeting: %w", err)
	}
	size, cmd := binary.LittleEndian.Uint32(frame[:4]), frame[4]
	if cmd != runnerapi.SplitPeerHello || size != runnerapi.SplitPeerSessionBytes {
		return nil, fmt.Errorf("the first frame is command %d of %d bytes, not the peer greeting (command %d of %d bytes)",
			cmd, size, runnerapi.SplitPeerHello, runnerapi.SplitPeerSessionBytes)
	}
	if _, err := io.ReadFull(c, frame[5:]); err != nil {
		return nil, fmt.Errorf("a truncated peer greeting: %w", err)
	}
	return frame, nil
}
