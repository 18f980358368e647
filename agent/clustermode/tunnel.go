package clustermode

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"

	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// dialOut, with Config.GatewayTunnel, holds the agent's connection to the gateway
// until ctx ends and serves the API on it as on its own listener: the same TLS with
// the node certificate inside each stream, the same handler.
func dialOut(ctx context.Context, cfg Config, tlsSrc *pki.Source, httpSrv *http.Server) {
	if cfg.GatewayTunnel == "" {
		return
	}
	a := &tunnel.Agent{Gateway: cfg.GatewayTunnel, Node: cfg.NodeName, Certificates: tlsSrc, Log: cfg.Log.WithName("tunnel")}
	cfg.Log.Info("Dialing out to the gateway's tunnel", "gatewayTunnel", cfg.GatewayTunnel)
	go func() {
		_ = a.Run(ctx, func(ln net.Listener) error { return httpSrv.Serve(tls.NewListener(ln, tlsSrc.ServerConfig())) })
	}()
}
