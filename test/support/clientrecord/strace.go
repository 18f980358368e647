package clientrecord

import (
	"net/netip"
	"regexp"
	"slices"
)

// StraceArgs are strace's arguments (before the command) that record a process
// tree's connect and send calls to file: what OffHostAddrs reads.
func StraceArgs(file string) []string {
	return []string{"-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", file, "--"}
}

// straceAddr matches the IPv4 and IPv6 addresses in strace's socket address syntax.
var straceAddr = regexp.MustCompile(`inet_addr\("([0-9.]+)"\)|inet_pton\(AF_INET6, "([0-9a-fA-F:.]+)"`)

// OffHostAddrs returns the addresses in a trace of StraceArgs that are not on this
// machine (neither loopback nor unspecified), each once, in order. A DNS lookup goes
// to the resolver's address, so it counts.
func OffHostAddrs(trace []byte) []string {
	var out []string
	for _, m := range straceAddr.FindAllSubmatch(trace, -1) {
		s := string(m[1]) + string(m[2])
		a, err := netip.ParseAddr(s)
		if err == nil && (a.Unmap().IsLoopback() || a.Unmap().IsUnspecified()) {
			continue
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
