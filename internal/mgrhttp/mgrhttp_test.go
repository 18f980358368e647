package mgrhttp

import (
	"net"
	"testing"
)

func TestListen(t *testing.T) {
	given, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	tests := []struct {
		name string
		ln   net.Listener
		addr string
		want string // "given", "none" or "new"
	}{
		{"a listener wins over an address", given, "127.0.0.1:0", "given"},
		{"0 disables", nil, "0", "none"},
		{"empty disables", nil, "", "none"},
		{"an address is listened on", nil, "127.0.0.1:0", "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := Listen(tt.ln, tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			got := "new"
			switch {
			case ln == nil:
				got = "none"
			case ln == given:
				got = "given"
			}
			if got != tt.want {
				t.Fatalf("Listen(%v, %q) gave %s, want %s", tt.ln, tt.addr, got, tt.want)
			}
			if got == "new" {
				defer ln.Close()
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatalf("dialing the new listener: %v", err)
				}
				c.Close()
			}
		})
	}
	if _, err := Listen(nil, given.Addr().String()); err == nil {
		t.Error("Listen on an address in use succeeded")
	}
}
