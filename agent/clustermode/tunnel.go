package clustermode

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"

	"github.com/macfleet/macfleet/agent/certs"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// outbound is the agent's half of the tunnel with Config.GatewayTunnel, nil without;
// with Config.ConnectAuto it holds the tunnel only while the gateway does not reach
// endpoint, the advertised address.
func outbound(cfg Config, tlsSrc *pki.Source, endpoint string) *tunnel.Agent {
	if cfg.GatewayTunnel == "" {
		return nil
	}
	a := &tunnel.Agent{Gateway: cfg.GatewayTunnel, Node: cfg.NodeName, Certificates: tlsSrc, Log: cfg.Log.WithName("tunnel")}
	if cfg.ConnectAuto {
		a.Advertised, a.ProbeEvery = endpoint, cfg.TunnelProbeInterval
	}
	return a
}

// dialOut, with a tunnel, holds the agent's connection to the gateway until ctx
// ends and serves the API on it as on its own listener: the same TLS with the node
// certificate inside each stream, the same handler. With a keeper it dials once the
// keeper has the certificate and the fleet's CA bundle: a dial before fails and
// waits out the tunnel's backoff while the Mac already reports Ready.
func dialOut(ctx context.Context, cfg Config, a *tunnel.Agent, tlsSrc *pki.Source, keeper *certs.Keeper, httpSrv *http.Server) {
	if a == nil {
		return
	}
	cfg.Log.Info("Dialing out to the gateway's tunnel", "gatewayTunnel", cfg.GatewayTunnel)
	go func() {
		if keeper != nil {
			select {
			case <-keeper.Ready():
			case <-ctx.Done():
				return
			}
		}
		_ = a.Run(ctx, func(ln net.Listener) error { return httpSrv.Serve(tls.NewListener(ln, tlsSrc.ServerConfig())) })
	}()
}

// peerTransports reach other Macs' agents for peer fetch with this Mac's
// certificate: through the tunnel while one is up (the gateway relays what it asked
// this Mac to fetch, tunnel.PeerRoute), else at their addresses.
func peerTransports(tlsSrc *pki.Source, a *tunnel.Agent) *pki.Transports {
	if a == nil {
		return pki.NewTransports(tlsSrc, nil)
	}
	return pki.NewTransports(tlsSrc, func() *http.Transport {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = a.DialContext(pki.NodeFrom, tr.DialContext)
		return tr
	})
}
