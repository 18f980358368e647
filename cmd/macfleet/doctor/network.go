package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultNetTimeout bounds each network check when Options.NetTimeout is zero.
const DefaultNetTimeout = 5 * time.Second

// ClusterCheck reaches the API server named by the kubeconfig at path as the agent
// would: a TCP connection, then a TLS handshake that verifies the server's
// certificate against the kubeconfig's CA, within timeout. No request is sent.
func ClusterCheck(ctx context.Context, path string, timeout time.Duration) ServerCheck {
	c := ServerCheck{Name: "cluster"}
	if path == "" {
		c.Check, c.Result = CheckSkipped, "no --kubeconfig (or $KUBECONFIG): give the node's to check the API server is reachable"
		return c
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("reading %s: %v", path, err)
		return c
	}
	u, err := url.Parse(rc.Host)
	if err != nil || u.Hostname() == "" {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("the server %q of %s is not a URL", rc.Host, path)
		return c
	}
	port := u.Port()
	if port == "" {
		port = map[bool]string{true: "80", false: "443"}[u.Scheme == "http"]
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	cfg, err := rest.TLSConfigFor(rc)
	if err != nil {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("the TLS settings of %s: %v", path, err)
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		c.Check, c.Result, c.Fix = CheckFailed, fmt.Sprintf("cannot connect to %s: %v", addr, err), DialFix(err)
		return c
	}
	defer conn.Close()
	if cfg == nil { // plain http: connecting is all there is to check
		c.Check, c.Result = CheckOK, fmt.Sprintf("connected to %s in %s (plain HTTP)", addr, roundMs(time.Since(start)))
		return c
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	if err := tls.Client(conn, cfg).HandshakeContext(ctx); err != nil {
		c.Check, c.Result, c.Fix = CheckFailed, fmt.Sprintf("TLS with %s failed: %v", addr, err), TLSFix(err, u.Hostname())
		return c
	}
	verified := "its certificate verified against the kubeconfig's CA"
	if cfg.InsecureSkipVerify {
		verified = "its certificate NOT verified (insecure-skip-tls-verify)"
	}
	c.Check, c.Result = CheckOK, fmt.Sprintf("reached %s in %s, %s", addr, roundMs(time.Since(start)), verified)
	return c
}

// DialFix says what a failed connection to the API server means for a Mac.
func DialFix(err error) string {
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		return "the Mac cannot resolve the API server's name: use an address it resolves (macfleet nodes credentials --server)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens there: the kubeconfig must name the API server's address as the Macs reach it (macfleet nodes credentials --server)"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err):
		return "no answer: a cloud cluster's API server is reached from an office LAN only through a VPN or a tunnel; check its firewall and security groups allow the Mac"
	case errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to the API server from this Mac: a VPN or a tunnel between the networks is needed"
	}
	return "check the address, the network between the Mac and the cluster, and its firewalls"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TLSFix says what a failed TLS handshake with the API server at host means.
func TLSFix(err error, host string) string {
	var (
		hostErr      x509.HostnameError
		authorityErr x509.UnknownAuthorityError
	)
	switch {
	case errors.As(err, &hostErr):
		return fmt.Sprintf("the API server's certificate does not name %s: add it (k3s: k3s server --tls-san %s; managed clusters: use the endpoint they give) "+
			"and issue the credential again", host, host)
	case errors.As(err, &authorityErr):
		return "the certificate is not signed by the kubeconfig's CA (a proxy in between, or a credential of another cluster): issue it again with macfleet nodes credentials"
	}
	return "the server there does not speak TLS as an API server does: is it the API server's address?"
}

// AgentPortCheck says whether the agent can take its --listen address: free, or held
// by a server that speaks TLS (the agent, running); taken by anything else, the agent
// cannot start. advertise is the address the cluster dials, shown for the reader.
func AgentPortCheck(ctx context.Context, listen, advertise string, timeout time.Duration) ServerCheck {
	c := ServerCheck{Name: "agent port"}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("--listen %q: %v", listen, err)
		return c
	}
	dials := ""
	if advertise != "" {
		dials = "; the cluster dials " + advertise + " (--advertise-address), which its pods must reach"
	}
	ln, err := net.Listen("tcp", listen)
	if err == nil {
		ln.Close()
		c.Check, c.Result = CheckOK, fmt.Sprintf("%s is free for the agent%s", listen, dials)
		return c
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("cannot listen on %s: %v", listen, err)
		return c
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err == nil {
		defer conn.Close()
		// Only whether it speaks TLS: the agent's certificate is the Mac's own.
		err = tls.Client(conn, &tls.Config{InsecureSkipVerify: true}).HandshakeContext(ctx) //nolint:gosec // nothing is sent
	}
	if err != nil {
		c.Check, c.Result = CheckFailed, fmt.Sprintf("%s is taken by a program that does not answer TLS as the agent does (%v)", listen, err)
		c.Fix = "stop that program, or give the agent another port: --listen :PORT"
		return c
	}
	c.Check, c.Result = CheckOK, fmt.Sprintf("%s is in use by a TLS server: the agent, running%s", listen, dials)
	return c
}

func roundMs(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
