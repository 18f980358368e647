package credentials

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// CheckAdminServer says why the API server address of the administrator's kubeconfig
// cannot go into a Mac's credential as it is: a loopback address (127.0.0.1, ::1,
// localhost — a single-node cluster's kubeconfig, k3s's https://127.0.0.1:6443) names
// the Mac itself once the credential is on the Mac. It is nil for any other address.
// An address given explicitly (--server) is never checked: it may be right for an agent
// on the API server's own machine.
func CheckAdminServer(host string) error {
	if host == "" {
		return nil // normalizeServer says what is missing
	}
	s := host
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil // normalizeServer says what is wrong
	}
	name := u.Hostname()
	ip := net.ParseIP(name)
	if !strings.EqualFold(name, "localhost") && !strings.HasSuffix(strings.ToLower(name), ".localhost") &&
		(ip == nil || !ip.IsLoopback()) {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = "6443"
	}
	return fmt.Errorf("your kubeconfig reaches the API server at %s, a loopback address: on a Mac it names the Mac "+
		"itself, so the agent could never reach the cluster. Pass --server with the address the Macs reach the API "+
		"server by, e.g. --server https://<the server's LAN address or DNS name>:%s (on k3s its certificate must name "+
		"that address: k3s server --tls-san <address>); pass --server %s explicitly only if the agent runs on this "+
		"very machine", u.Scheme+"://"+u.Host, port, u.Scheme+"://"+u.Host)
}
