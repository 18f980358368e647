package httpserver

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// refuseTimeout bounds the time spent on a refused connection.
const refuseTimeout = time.Second

// Listener caps the connections open on ln at l.MaxConnections (none when negative):
// past the cap, a new connection is answered "503 Service Unavailable" with
// Retry-After and an OpenAI-shaped error body, then closed; the connections already
// open are served as before.
//
// Wrap the TCP listener, beneath any TLS (tls.NewListener(Listener(ln, l), cfg)): the
// HTTP server recognizes a TLS connection by its type, which a wrapper above TLS hides.
func Listener(ln net.Listener, l Limits) net.Listener {
	l = l.WithDefaults()
	if l.MaxConnections < 0 {
		return ln
	}
	return &capListener{Listener: ln, slots: make(chan struct{}, l.MaxConnections), refusal: Refusal(l.MaxConnections)}
}

// Refusal is the whole HTTP response a connection past a cap of max gets.
func Refusal(max int) []byte {
	body := `{"error":{"message":"this server already holds its limit of ` + strconv.Itoa(max) +
		` open connections; retry shortly","type":"service_unavailable","param":null,"code":"too_many_connections"}}` + "\n"
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
}

type capListener struct {
	net.Listener
	slots   chan struct{}
	refusal []byte
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
		default:
			go refuse(c, l.refusal)
		}
	}
}

// refuse answers c with the refusal and closes it; the request is drained first
// (briefly) so that closing does not reset the connection before the client read the
// answer.
func refuse(c net.Conn, refusal []byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	if _, err := c.Write(refusal); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// slotConn gives its slot back when closed.
type slotConn struct {
	net.Conn
	release func()
}

func (c *slotConn) Close() error {
	c.release()
	return c.Conn.Close()
}
