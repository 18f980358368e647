package clustermode_test

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/agent/clustermode"
)

func TestGatewayTunnel(t *testing.T) {
	for _, tc := range []struct {
		connect, addr string
		want          string
		wantErr       string
	}{
		{connect: "", want: ""},
		{connect: "inbound", want: ""},
		{connect: "outbound", addr: "gw.example.com:7443", want: "gw.example.com:7443"},
		{connect: "outbound", wantErr: "--connect outbound needs --gateway-tunnel"},
		{connect: "outbound", addr: "gw.example.com", wantErr: "want HOST:PORT"},
		{connect: "inbound", addr: "gw.example.com:7443", wantErr: "--gateway-tunnel is for --connect outbound"},
		{connect: "sideways", wantErr: `--connect "sideways": want inbound or outbound`},
	} {
		got, err := clustermode.GatewayTunnel(tc.connect, tc.addr)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("GatewayTunnel(%q, %q) = %q, %v; want an error with %q", tc.connect, tc.addr, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("GatewayTunnel(%q, %q) = %q, %v; want %q", tc.connect, tc.addr, got, err, tc.want)
		}
	}
}
