package standalone

import (
	"fmt"
	"net"
	"strings"
)

// CheckExposure refuses to serve the API without a key on an address other machines
// can reach (every interface, a LAN address, a name other than localhost) unless
// insecure says the user means it: the admin API unloads models and clears caches,
// and the OpenAI API spends the machine's memory and time.
func CheckExposure(listen string, hasKey, insecure bool) error {
	if hasKey || insecure || IsLoopback(listen) {
		return nil
	}
	return fmt.Errorf("listen %s is reachable from other machines and no API key is set: "+
		"set one with --api-key or --api-key-file (apiKey in the config file), "+
		"or pass --insecure to serve every machine that can reach this address without a key", listen)
}

// IsLoopback reports whether listen (host:port) accepts connections from this machine
// only: a loopback address or localhost. An empty host is every interface; any other
// name counts as reachable, since it may resolve to anything.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
