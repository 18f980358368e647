package sourcepolicy

import (
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// fleetSpec is the policy of the examples: team-a may fetch from its mirror and its
// model directory, every namespace from the registries; the cluster's networks are
// denied and one loopback address is allowed.
func fleetSpec() v1alpha1.SourcePolicySpec {
	return v1alpha1.SourcePolicySpec{
		Rules: []v1alpha1.SourcePolicyRule{
			{Namespaces: []string{"*"}, Registries: []v1alpha1.SourceRegistry{v1alpha1.RegistryHF, v1alpha1.RegistryOllama}},
			{Namespaces: []string{"team-a"}, Hosts: []string{"models.example.com", "*.mirror.example.org", "10.0.3.7"},
				FileDirectories: []string{"/Volumes/models/team-a", "/srv/shared/"}},
			{Namespaces: []string{"team-b"}, Hosts: []string{"plain.example.com"}, AllowPlainHTTP: true},
			{Namespaces: []string{"team-c"}, Registries: []v1alpha1.SourceRegistry{v1alpha1.RegistryHF}, Hosts: []string{"models.example.com"}},
		},
		DeniedNetworks:  []string{"10.96.0.0/12", "10.244.0.0/16", "fd00:10:96::/112"},
		AllowedNetworks: []string{"127.0.0.2/32", "10.0.3.7/32"},
	}
}

func fleetPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: fleetSpec()})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ips(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, v := range s {
		out = append(out, netip.MustParseAddr(v))
	}
	return out
}

// decideCases are checked against Decide, and those without addresses against the
// admission policy too (admission_test.go): both must give the same answer and
// reason.
var decideCases = []struct {
	name      string
	ns, src   string
	ips       []netip.Addr
	wantAllow bool
	// wantReason is a substring of the reason.
	wantReason string
}{
	{"hf for everyone", "team-z", "hf://org/repo/m.gguf", nil, true, ""},
	{"ollama for everyone", "team-z", "ollama://llama3", nil, true, ""},
	{"https from a listed host", "team-a", "https://models.example.com/m.gguf", ips("93.184.216.34"), true, ""},
	{"host match ignores case and port", "team-a", "https://Models.Example.com:8443/m.gguf", nil, true, ""},
	{"wildcard subdomain", "team-a", "https://eu.mirror.example.org/m.gguf", nil, true, ""},
	{"wildcard does not match the apex", "team-a", "https://mirror.example.org/m.gguf", nil, false,
		`source host "mirror.example.org" is not allowed for namespace "team-a": add it to spec.rules[].hosts of a rule for namespace "team-a" in SourcePolicy "default"`},
	{"wildcard does not match a look-alike", "team-a", "https://evilmirror.example.org/m.gguf", nil, false, "is not allowed"},
	{"listed IP host", "team-a", "https://10.0.3.7/m.gguf", ips("10.0.3.7"), true, ""},
	{"unlisted host", "team-a", "https://evil.example.net/m.gguf", nil, false, `source host "evil.example.net" is not allowed for namespace "team-a"`},
	{"another namespace's host", "team-z", "https://models.example.com/m.gguf", nil, false, `namespace "team-z"`},
	{"plain http needs allowPlainHTTP", "team-a", "http://models.example.com/m.gguf", nil, false,
		`plain http:// sources from host "models.example.com" are not allowed for namespace "team-a": use https://, or set allowPlainHTTP`},
	{"plain http allowed", "team-b", "http://plain.example.com/m.gguf", nil, true, ""},
	{"registry not granted", "team-c", "ollama://llama3", nil, true, ""}, // the "*" rule grants it
	{"file under an allowed directory", "team-a", "file:///Volumes/models/team-a/qwen.gguf", nil, true, ""},
	{"file under a directory written with a slash", "team-a", "file:///srv/shared/x/m.gguf", nil, true, ""},
	{"file in a sibling directory", "team-a", "file:///Volumes/models/team-ab/m.gguf", nil, false,
		`file /Volumes/models/team-ab/m.gguf is not under a directory allowed for namespace "team-a": add its directory to spec.rules[].fileDirectories`},
	{"file escaping with ..", "team-a", "file:///Volumes/models/team-a/../../../etc/passwd", nil, false,
		"file source file:///Volumes/models/team-a/../../../etc/passwd must name a plain absolute path: no . or .. segments, no //, no %-escapes but %20, no query or fragment"},
	{"file escaping with escaped dots", "team-a", "file:///Volumes/models/team-a/%2e%2e/team-b/m.gguf", nil, false, "must name a plain absolute path"},
	{"file with a . segment", "team-a", "file:///Volumes/models/team-a/./m.gguf", nil, false, "must name a plain absolute path"},
	{"file with a double slash", "team-a", "file:///Volumes/models/team-a//m.gguf", nil, false, "must name a plain absolute path"},
	{"file with an escaped space", "team-a", "file:///Volumes/models/team-a/My%20Models/m.gguf", nil, true, ""},
	{"file with a literal space", "team-a", "file:///Volumes/models/team-a/My Models/m.gguf", nil, true, ""},
	{"file with an escaped slash", "team-a", "file:///Volumes/models/team-a%2f..%2fteam-b/m.gguf", nil, false, "must name a plain absolute path"},
	{"file for a namespace without directories", "team-b", "file:///etc/passwd", nil, false, `namespace "team-b"`},
	{"invalid source", "team-a", "ftp://x/y", nil, false, "invalid model source"},
	{"loopback address of a listed host", "team-a", "https://models.example.com/m.gguf", ips("127.0.0.1"), false,
		"address 127.0.0.1 is loopback, which model fetches may not connect to: to allow it, add 127.0.0.1/32 to spec.allowedNetworks"},
	{"IPv6 loopback", "team-a", "https://models.example.com/m.gguf", ips("::1"), false, "address ::1 is loopback"},
	{"IPv4-mapped loopback", "team-a", "https://models.example.com/m.gguf", ips("::ffff:127.0.0.1"), false, "address 127.0.0.1 is loopback"},
	{"cloud metadata", "team-a", "https://models.example.com/m.gguf", ips("169.254.169.254"), false, "address 169.254.169.254 is link-local"},
	{"IPv6 link-local", "team-a", "https://models.example.com/m.gguf", ips("fe80::1"), false, "is link-local"},
	{"this network", "team-a", "https://models.example.com/m.gguf", ips("0.0.0.0"), false, `is "this network"`},
	{"service CIDR", "team-a", "https://models.example.com/m.gguf", ips("10.96.0.10"), false, "address 10.96.0.10 is in deniedNetworks 10.96.0.0/12"},
	{"pod CIDR", "team-a", "https://models.example.com/m.gguf", ips("10.244.1.5"), false, "in deniedNetworks 10.244.0.0/16"},
	{"IPv6 service CIDR", "team-a", "https://models.example.com/m.gguf", ips("fd00:10:96::a"), false, "in deniedNetworks fd00:10:96::/112"},
	{"one of several addresses denied", "team-a", "https://models.example.com/m.gguf", ips("93.184.216.34", "169.254.169.254"), false, "link-local"},
	{"explicitly allowed loopback", "team-a", "https://models.example.com/m.gguf", ips("127.0.0.2"), true, ""},
	{"registry resolving to a denied address", "team-z", "hf://org/repo/m.gguf", ips("10.96.0.1"), false, "deniedNetworks"},
	{"RFC 1918 10/8", "team-a", "https://models.example.com/m.gguf", ips("10.1.2.3"), false,
		"address 10.1.2.3 is private (RFC 1918), which model fetches may not connect to: to allow it, add 10.1.2.3/32 to spec.allowedNetworks"},
	{"RFC 1918 172.16/12", "team-a", "https://models.example.com/m.gguf", ips("172.31.255.1"), false, "is private (RFC 1918)"},
	{"just outside 172.16/12", "team-a", "https://models.example.com/m.gguf", ips("172.32.0.1"), true, ""},
	{"RFC 1918 192.168/16", "team-a", "https://models.example.com/m.gguf", ips("192.168.1.1"), false, "is private (RFC 1918)"},
	{"IPv4-mapped RFC 1918", "team-a", "https://models.example.com/m.gguf", ips("::ffff:192.168.0.10"), false, "address 192.168.0.10 is private"},
	{"ULA", "team-a", "https://models.example.com/m.gguf", ips("fd12:3456::1"), false,
		"address fd12:3456::1 is unique local (ULA), which model fetches may not connect to: to allow it, add fd12:3456::1/128 to spec.allowedNetworks"},
	{"ULA fc00::/8 half", "team-a", "https://models.example.com/m.gguf", ips("fc00::5"), false, "is unique local (ULA)"},
	{"CGNAT", "team-a", "https://models.example.com/m.gguf", ips("100.64.0.1"), false, "is shared address space (CGNAT)"},
	{"just outside CGNAT", "team-a", "https://models.example.com/m.gguf", ips("100.128.0.1"), true, ""},
	{"NAT64 of a LAN address", "team-a", "https://models.example.com/m.gguf", ips("64:ff9b::a00:1"), false, "address 64:ff9b::a00:1 is NAT64"},
	{"local-use NAT64", "team-a", "https://models.example.com/m.gguf", ips("64:ff9b:1::c0a8:101"), false, "is local-use NAT64"},
	{"benchmarking 198.18/15", "team-a", "https://models.example.com/m.gguf", ips("198.19.255.1"), false, "is benchmarking (RFC 2544)"},
	{"just outside 198.18/15", "team-a", "https://models.example.com/m.gguf", ips("198.20.0.1"), true, ""},
	{"reserved 240/4", "team-a", "https://models.example.com/m.gguf", ips("240.0.0.1"), false, "is reserved (240.0.0.0/4)"},
	{"limited broadcast", "team-a", "https://models.example.com/m.gguf", ips("255.255.255.255"), false, "is reserved (240.0.0.0/4)"},
	{"6to4 of a LAN address", "team-a", "https://models.example.com/m.gguf", ips("2002:c0a8:101::1"), false,
		"address 2002:c0a8:101::1 is 6to4 (it embeds the IPv4 address 192.168.1.1)"},
	{"Teredo of a LAN address", "team-a", "https://models.example.com/m.gguf", ips("2001:0:4136:e378:8000:63bf:f5ff:fffe"), false,
		"is Teredo (it embeds the IPv4 address 10.0.0.1)"},
	{"NAT64 names its IPv4", "team-a", "https://models.example.com/m.gguf", ips("64:ff9b::a9fe:a9fe"), false, "NAT64 (it embeds the IPv4 address 169.254.169.254)"},
	{"just outside Teredo", "team-a", "https://models.example.com/m.gguf", ips("2001:1::1"), true, ""},
	{"public IPv6", "team-a", "https://models.example.com/m.gguf", ips("2606:4700::1111"), true, ""},
}

func TestDecide(t *testing.T) {
	p := fleetPolicy(t)
	for _, tc := range decideCases {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Decide(tc.ns, tc.src, tc.ips)
			if d.Allowed != tc.wantAllow {
				t.Fatalf("Decide(%q, %q, %v) = %+v, want allowed=%v", tc.ns, tc.src, tc.ips, d, tc.wantAllow)
			}
			if tc.wantAllow && d.Reason != "" {
				t.Errorf("allowed with a reason: %q", d.Reason)
			}
			if !strings.Contains(d.Reason, tc.wantReason) {
				t.Errorf("reason %q does not contain %q", d.Reason, tc.wantReason)
			}
		})
	}
}

func TestDefaultPolicy(t *testing.T) {
	p := Default()
	for _, tc := range []struct {
		src        string
		ip         string
		wantAllow  bool
		wantReason string
	}{
		{"hf://org/repo/m.gguf", "", true, ""},
		{"ollama://library/llama3:8b", "", true, ""},
		{"https://models.example.com/m.gguf", "", false,
			`source host "models.example.com" is not allowed for namespace "ns": add it to spec.rules[].hosts of a rule for namespace "ns" in SourcePolicy "default" (it does not exist yet, so the built-in default applies: create it)`},
		{"file:///etc/passwd", "", false, "file /etc/passwd is not under a directory allowed"},
		{"hf://org/repo/m.gguf", "127.0.0.1", false, "loopback"},
		{"hf://org/repo/m.gguf", "10.1.2.3", false, "is private (RFC 1918)"},
		{"hf://org/repo/m.gguf", "93.184.216.34", true, ""},
	} {
		var ips []netip.Addr
		if tc.ip != "" {
			ips = []netip.Addr{netip.MustParseAddr(tc.ip)}
		}
		d := p.Decide("ns", tc.src, ips)
		if d.Allowed != tc.wantAllow || !strings.Contains(d.Reason, tc.wantReason) {
			t.Errorf("Default().Decide(%q, %v) = %+v, want allowed=%v and a reason containing %q", tc.src, ips, d, tc.wantAllow, tc.wantReason)
		}
	}
	if p, err := Compile(nil); err != nil || p.Name() != Default().Name() {
		t.Errorf("Compile(nil) = %v, %v; want the default", p, err)
	}
}

func TestCompileRejectsBadCIDRs(t *testing.T) {
	_, err := Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{DeniedNetworks: []string{"10.0.0.0/8", "nonsense"}, AllowedNetworks: []string{"1.2.3.4"}}})
	if err == nil || !strings.Contains(err.Error(), "deniedNetworks") || !strings.Contains(err.Error(), "allowedNetworks") {
		t.Fatalf("Compile with bad CIDRs: %v, want errors naming both fields", err)
	}
}

func TestUnderAny(t *testing.T) {
	for _, tc := range []struct {
		p    string
		dirs []string
		want bool
	}{
		{"/a/b/c", []string{"/a/b"}, true},
		{"/a/b", []string{"/a/b"}, true},
		{"/a/bc", []string{"/a/b"}, false},
		{"/a/b/../c", []string{"/a/b"}, false},
		{"/x", []string{"/"}, true},
		{"/a/b", []string{"a/b"}, false},
		{"a/b", []string{"/a"}, false},
		{"/a/b", nil, false},
	} {
		if got := UnderAny(tc.p, tc.dirs); got != tc.want {
			t.Errorf("UnderAny(%q, %q) = %v, want %v", tc.p, tc.dirs, got, tc.want)
		}
	}
}
