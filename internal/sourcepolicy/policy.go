// Package sourcepolicy decides which model sources a namespace may use and which
// network addresses a model fetch may connect to, from the fleet's SourcePolicy
// (api/v1alpha1, the one named "default").
//
// The decision is pure: Decide takes the policy, a namespace, a source and the
// addresses its host resolved to, and returns allowed or a reason naming the fix.
// Three places enforce it:
//
//   - admission: the ValidatingAdmissionPolicy macfleet-source-policy
//     (config/admission/source-policy.yaml) rejects a ModelDeployment whose source the
//     rules deny, with the same reasons in CEL;
//   - the manager's memory estimator, before it reads a GGUF header over HTTP;
//   - the node agents' model store, before a download and before opening a file://
//     source (after resolving symbolic links); its Locator, with which `macfleet
//     models fit` reads a header, applies the same checks.
//
// Addresses are checked when a connection is made (Transport: a net.Dialer Control
// hook sees the address actually dialled), so a host name that resolves to a loopback,
// link-local or cluster address — including one whose DNS answer changes between a
// check and the connection — is refused, and so is every redirect target.
package sourcepolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// Policy is a compiled SourcePolicy. The zero value allows nothing; use Default or
// Compile. A Policy is immutable and safe for concurrent use.
type Policy struct {
	// name says where the policy came from, in reasons ("SourcePolicy \"default\"").
	name    string
	rules   []v1alpha1.SourcePolicyRule
	denied  []netip.Prefix
	allowed []netip.Prefix
}

// builtinDenied are the networks no fetch connects to unless allowedNetworks lists
// them.
var builtinDenied = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\""},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	// The Macs' own networks: a fetch from a tenant's source must not become a request
	// into the LAN (a router's admin page, a NAS, another Mac's agent).
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (ULA)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	// NAT64 prefixes embed an IPv4 address, which may be any of the above.
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
	// 6to4 and Teredo addresses embed an IPv4 address too (the 6to4 router's, the
	// Teredo client's), which a relay on the path turns into a connection to it.
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	// Never a public host: the benchmarking range (RFC 2544), often routed to lab
	// gear, and the reserved 240/4 with the limited broadcast address.
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (RFC 2544)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240.0.0.0/4)"},
}

// Default is the policy without a SourcePolicy object: every namespace may use hf://
// and ollama:// sources, nothing else, and the built-in address denials apply.
func Default() *Policy {
	return &Policy{
		name: "SourcePolicy \"default\" (it does not exist yet, so the built-in default applies: create it)",
		rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{"*"},
			Registries: []v1alpha1.SourceRegistry{v1alpha1.RegistryHF, v1alpha1.RegistryOllama}}},
	}
}

// Compile checks and compiles sp. A nil sp is Default().
func Compile(sp *v1alpha1.SourcePolicy) (*Policy, error) {
	if sp == nil {
		return Default(), nil
	}
	p := &Policy{name: fmt.Sprintf("SourcePolicy %q", sp.Name), rules: sp.Spec.Rules}
	var errs []error
	for _, l := range []struct {
		field string
		in    []string
		out   *[]netip.Prefix
	}{{"deniedNetworks", sp.Spec.DeniedNetworks, &p.denied}, {"allowedNetworks", sp.Spec.AllowedNetworks, &p.allowed}} {
		for _, c := range l.in {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", l.field, err))
				continue
			}
			*l.out = append(*l.out, pfx.Masked())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("SourcePolicy %q: %w", sp.Name, err)
	}
	return p, nil
}

// Name says where the policy came from, as reasons write it.
func (p *Policy) Name() string { return p.name }

// Decision is the outcome of a check.
type Decision struct {
	Allowed bool
	// Reason says why not, and what to change to allow it; empty when allowed.
	Reason string
}

func allow() Decision { return Decision{Allowed: true} }

func deny(format string, args ...any) Decision {
	return Decision{Reason: fmt.Sprintf(format, args...)}
}

// Decide says whether namespace may use the model source raw, and, when ips are
// given, whether a fetch may connect to each of them (the addresses raw's host, or a
// registry's, resolved to).
func (p *Policy) Decide(namespace, raw string, ips []netip.Addr) Decision {
	if d := p.DecideSource(namespace, raw); !d.Allowed {
		return d
	}
	for _, ip := range ips {
		if d := p.DecideAddr(ip); !d.Allowed {
			return d
		}
	}
	return allow()
}

// DecideSource checks the source string against the rules for namespace; it does
// not look at addresses.
func (p *Policy) DecideSource(namespace, raw string) Decision {
	src, err := modelsource.Parse(raw)
	if err != nil {
		return deny("%v", err)
	}
	rules := p.rulesFor(namespace)
	fix := func(field string) string {
		return fmt.Sprintf("add it to spec.rules[].%s of a rule for namespace %q in %s", field, namespace, p.name)
	}
	switch src.Scheme {
	case modelsource.HuggingFace, modelsource.Ollama:
		reg := v1alpha1.SourceRegistry(src.Scheme)
		for _, r := range rules {
			if slices.Contains(r.Registries, reg) {
				return allow()
			}
		}
		return deny("%s:// sources are not allowed for namespace %q: %s", reg, namespace, fix("registries"))
	case modelsource.HTTP:
		u, err := url.Parse(src.URL)
		if err != nil {
			return deny("invalid model source %q: %v", raw, err)
		}
		host := strings.ToLower(u.Hostname())
		plain := strings.EqualFold(u.Scheme, "http")
		hostListed := false
		for _, r := range rules {
			if !hostMatches(r.Hosts, host) {
				continue
			}
			hostListed = true
			if !plain || r.AllowPlainHTTP {
				return allow()
			}
		}
		if hostListed {
			return deny("plain http:// sources from host %q are not allowed for namespace %q: use https://, or set allowPlainHTTP on the rule for namespace %q that lists the host in %s",
				host, namespace, namespace, p.name)
		}
		return deny("source host %q is not allowed for namespace %q: %s", host, namespace, fix("hosts"))
	case modelsource.File:
		if !plainFilePath(raw) {
			return deny("file source %s must name a plain absolute path: no . or .. segments, no //, no %%-escapes but %%20, no query or fragment", raw)
		}
		for _, r := range rules {
			if UnderAny(src.LocalPath, r.FileDirectories) {
				return allow()
			}
		}
		return deny("file %s is not under a directory allowed for namespace %q: add its directory to spec.rules[].fileDirectories of a rule for namespace %q in %s",
			src.LocalPath, namespace, namespace, p.name)
	}
	return deny("model source %q has an unknown scheme", raw)
}

// plainFilePath reports whether the path of the file:// source raw is written
// plainly: no %-escapes but %20 (a space), no . or .. segments, no "//", no query or
// fragment. The admission policy cannot unescape and clean a path as Parse does, so
// both refuse what would need it, and a path is checked as it is written.
func plainFilePath(raw string) bool {
	_, rest, _ := strings.Cut(raw, "://")
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return false
	}
	p := strings.ReplaceAll(rest[i:], "%20", " ")
	if strings.ContainsAny(p, "%?#") || strings.Contains(p, "//") {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// FileDirectories are the directories file:// sources of namespace may be under.
func (p *Policy) FileDirectories(namespace string) []string {
	var dirs []string
	for _, r := range p.rulesFor(namespace) {
		dirs = append(dirs, r.FileDirectories...)
	}
	return dirs
}

func (p *Policy) rulesFor(namespace string) []v1alpha1.SourcePolicyRule {
	var out []v1alpha1.SourcePolicyRule
	for _, r := range p.rules {
		if slices.Contains(r.Namespaces, "*") || slices.Contains(r.Namespaces, namespace) {
			out = append(out, r)
		}
	}
	return out
}

// hostMatches reports whether host (lowercase, without port) is listed: exactly, or
// below a "*.suffix" entry.
func hostMatches(list []string, host string) bool {
	if host == "" {
		return false
	}
	for _, h := range list {
		h = strings.ToLower(h)
		if suffix, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
			continue
		}
		if h == host {
			return true
		}
		// An IPv6 entry may be written with or without brackets.
		if strings.Trim(h, "[]") == host {
			return true
		}
	}
	return false
}

// UnderAny reports whether the absolute path p is one of dirs or below one of them.
// Both are cleaned first; "/" as a directory allows every path.
func UnderAny(p string, dirs []string) bool {
	if !path.IsAbs(p) {
		return false
	}
	p = path.Clean(p)
	for _, d := range dirs {
		if !path.IsAbs(d) {
			continue
		}
		d = path.Clean(d)
		if d == "/" || p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// DecideAddr says whether a fetch may connect to ip: not when it is in a built-in
// denied range or in deniedNetworks, unless allowedNetworks holds it.
func (p *Policy) DecideAddr(ip netip.Addr) Decision {
	if !ip.IsValid() {
		return deny("no valid address to connect to")
	}
	ip = ip.Unmap().WithZone("")
	for _, a := range p.allowed {
		if a.Contains(ip) {
			return allow()
		}
	}
	// The operator's own list first: its reason is the more specific.
	what := ""
	for _, d := range p.denied {
		if d.Contains(ip) {
			what = "in deniedNetworks " + d.String()
			break
		}
	}
	if what == "" {
		for _, b := range builtinDenied {
			if b.prefix.Contains(ip) {
				what = b.what
				if v4, ok := embeddedIPv4(ip); ok {
					what += fmt.Sprintf(" (it embeds the IPv4 address %s)", v4)
				}
				break
			}
		}
	}
	if what == "" {
		return allow()
	}
	return deny("address %s is %s, which model fetches may not connect to: to allow it, add %s to spec.allowedNetworks of %s",
		ip, what, netip.PrefixFrom(ip, ip.BitLen()), p.name)
}

// embeddedIPv4 is the IPv4 address an IPv6 address of a translation or tunnelling
// prefix carries: NAT64's last 32 bits, 6to4's bits 16 to 48, Teredo's client (the
// last 32 bits, inverted).
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case b[0] == 0x20 && b[1] == 0x02: // 6to4, 2002::/16
		return netip.AddrFrom4([4]byte(b[2:6])), true
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0: // Teredo, 2001::/32
		return netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), true
	case netip.MustParsePrefix("64:ff9b::/96").Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	}
	return netip.Addr{}, false
}
