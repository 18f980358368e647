package splitlink

import (
	"context"
	"encoding/binary"
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
// Mac (nil when there is none of that name), and the loopback address the local
// worker serving that shard listens on ("" while it is not running).
type Lookup func(ctx context.Context, namespace, name string) (mr *v1alpha1.ModelReplica, workerAddr string)

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
	ns, name, peer, ok := parsePath(r.URL.EscapedPath())
	if !ok {
		refuse(w, http.StatusNotFound, openaierr.TypeInvalidRequest, codeNotFoundPath, "no such endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	id, hasCert := pki.PeerIdentity(r.TLS)
	if !hasCert || id.Kind != pki.KindNode {
		who := "a caller without a Mac's certificate"
		if hasCert {
			who = "the certificate of " + id.String()
		}
		refuse(w, http.StatusForbidden, typePermission, CodeForbidden,
			who+" may not open a split link: only the Mac of the replica's head may, with its fleet certificate")
		return
	}
	if r.Method != http.MethodGet || !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), Protocol) {
		refuse(w, http.StatusUpgradeRequired, openaierr.TypeInvalidRequest, CodeNotALink,
			"a split link is a GET with Connection: Upgrade and Upgrade: "+Protocol)
		return
	}
	mr, addr := h.Lookup(r.Context(), ns, name)
	authorize := Authorize
	if peer {
		authorize = AuthorizePeer
	}
	if err := authorize(mr, h.Self, id.Name); err != nil {
		h.Log.Info("Refused a split link", "caller", id.String(), "replica", ns+"/"+name, "why", err.Error())
		refuse(w, http.StatusForbidden, typePermission, CodeForbidden, err.Error())
		return
	}
	if addr == "" {
		refuse(w, http.StatusServiceUnavailable, openaierr.TypeUnavailable, CodeUnavailable,
			"the worker of replica "+ns+"/"+name+" on "+h.Self+" is not running yet")
		return
	}
	timeout := h.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	worker, err := (&net.Dialer{Timeout: timeout}).DialContext(r.Context(), "tcp", addr)
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, openaierr.TypeUnavailable, CodeUnavailable,
			"the worker of replica "+ns+"/"+name+" on "+h.Self+" is unreachable: "+err.Error())
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		worker.Close()
		refuse(w, http.StatusInternalServerError, openaierr.TypeServer, openaierr.CodeInternal, "the agent cannot hand over this connection: "+err.Error())
		return
	}
	// The server's deadlines for the request stay on a hijacked connection.
	_ = conn.SetDeadline(time.Time{})
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		worker.Close()
		return
	}
	client := &bufferedConn{Conn: conn, r: brw.Reader}
	if peer {
		// The previous worker's Mac may greet the worker as its peer, nothing else: a
		// runner's session opened on a peer link would be a second head.
		hello, err := readPeerHello(client, timeout)
		if err == nil {
			_, err = worker.Write(hello)
		}
		if err != nil {
			h.Log.Info("Closed a peer link", "caller", id.String(), "replica", ns+"/"+name, "why", err.Error())
			conn.Close()
			worker.Close()
			return
		}
	}
	h.Log.V(1).Info("Opened a split link", "caller", id.Name, "replica", ns+"/"+name, "worker", addr, "peer", peer)
	pipe(client, worker)
	h.Log.V(1).Info("Closed a split link", "caller", id.Name, "replica", ns+"/"+name)
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
