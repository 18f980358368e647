package clustermode_test

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/agent/clustermode"
)

func TestParseConnect(t *testing.T) {
	for _, tc := range []struct {
		connect, addr string
		want          clustermode.Connection
		wantErr       string
	}{
		{connect: "", want: clustermode.Connection{}},
		{connect: "", addr: "gw.example.com:7443", want: clustermode.Connection{Tunnel: "gw.example.com:7443", Auto: true}},
		{connect: "inbound", want: clustermode.Connection{}},
		{connect: "outbound", addr: "gw.example.com:7443", want: clustermode.Connection{Tunnel: "gw.example.com:7443"}},
		{connect: "auto", addr: "gw.example.com:7443", want: clustermode.Connection{Tunnel: "gw.example.com:7443", Auto: true}},
		{connect: "outbound", wantErr: "--connect outbound needs --gateway-tunnel"},
		{connect: "auto", wantErr: "--connect auto needs --gateway-tunnel"},
		{connect: "outbound", addr: "gw.example.com", wantErr: "want HOST:PORT"},
		{connect: "", addr: "gw.example.com", wantErr: "want HOST:PORT"},
		{connect: "inbound", addr: "gw.example.com:7443", wantErr: "--gateway-tunnel is for --connect outbound or auto"},
		{connect: "sideways", wantErr: `--connect "sideways": want inbound, outbound or auto`},
	} {
		got, err := clustermode.ParseConnect(tc.connect, tc.addr)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseConnect(%q, %q) = %+v, %v; want an error with %q", tc.connect, tc.addr, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseConnect(%q, %q) = %+v, %v; want %+v", tc.connect, tc.addr, got, err, tc.want)
		}
	}
}
