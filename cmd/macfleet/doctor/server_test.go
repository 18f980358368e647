package doctor

import (
	"context"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/macfleet/macfleet/internal/pki"
)

// pmset -g of a Mac mini left at the defaults of a desktop, while a share kept it
// awake; of the same mini set up as a server; of a laptop (no autorestart).
const (
	pmsetDesktop = `System-wide power settings:
Currently in use:
 standby              0
 Sleep On Power Button 1
 autorestart          0
 powernap             1
 networkoversleep     0
 disksleep            10
 sleep                1 (sleep prevented by sharingd, powerd)
 ttyskeepawake        1
 displaysleep         10
 tcpkeepalive         1
 womp                 1
`
	pmsetServer = `System-wide power settings:
Currently in use:
 standby              0
 Sleep On Power Button 1
 autorestart          1
 powernap             0
 disksleep            0
 sleep                0
 displaysleep         10
 womp                 1
`
	pmsetLaptop = `Battery Power:
Currently in use:
 lowpowermode         0
 sleep                1
 hibernatemode        3
 disksleep            10
 displaysleep         2
`
)

func TestParsePmset(t *testing.T) {
	got := ParsePmset([]byte(pmsetDesktop))
	want := map[string]PmsetValue{"standby": {}, "Sleep On Power Button": {N: 1}, "autorestart": {}, "powernap": {N: 1},
		"networkoversleep": {}, "disksleep": {N: 10}, "sleep": {N: 1, Note: "(sleep prevented by sharingd, powerd)"},
		"ttyskeepawake": {N: 1}, "displaysleep": {N: 10}, "tcpkeepalive": {N: 1}, "womp": {N: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePmset (-want +got):\n%s", diff)
	}
}

func TestPowerChecks(t *testing.T) {
	tests := []struct {
		name                 string
		out                  string
		err                  error
		sleep, restart       Check
		sleepFix, restartFix string
		sleepSays            string
	}{
		{name: "desktop defaults", out: pmsetDesktop, sleep: CheckWarn, restart: CheckWarn,
			sleepFix: "sudo pmset -a sleep 0 disksleep 0", restartFix: "sudo pmset -a autorestart 1",
			sleepSays: "sleeps after 1 min idle: its agent and models go off the network (sleep prevented by sharingd, powerd)"},
		{name: "server", out: pmsetServer, sleep: CheckOK, restart: CheckOK, sleepSays: "never sleeps"},
		{name: "laptop", out: pmsetLaptop, sleep: CheckWarn, restart: CheckInfo, sleepFix: "sudo pmset -a sleep 0 disksleep 0"},
		{name: "awake, disks sleep", out: "Currently in use:\n sleep 0\n disksleep 10\n autorestart 1\n", sleep: CheckOK, restart: CheckOK,
			sleepFix: "sudo pmset -a disksleep 0", sleepSays: "disks sleep after 10 min"},
		{name: "pmset failed", err: errors.New("exit status 1"), sleep: CheckUnavailable, restart: CheckUnavailable},
		{name: "no sleep line", out: "Currently in use:\n womp 1\n", sleep: CheckUnavailable, restart: CheckInfo},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sleep, restart := PowerChecks([]byte(tt.out), tt.err)
			if sleep.Check != tt.sleep || sleep.Fix != tt.sleepFix || !strings.Contains(sleep.Result, tt.sleepSays) {
				t.Errorf("sleep = %+v; want %s, fix %q, saying %q", sleep, tt.sleep, tt.sleepFix, tt.sleepSays)
			}
			if restart.Check != tt.restart || restart.Fix != tt.restartFix {
				t.Errorf("restart = %+v; want %s, fix %q", restart, tt.restart, tt.restartFix)
			}
		})
	}
}

func TestFirewallCheck(t *testing.T) {
	const exe = "/opt/homebrew/bin/macfleet"
	tests := []struct {
		name                  string
		global, stealth, app  string
		globalErr, appErr     error
		exe                   string
		want                  Check
		says, fixHas, notSays string
	}{
		{name: "off", global: "Firewall is disabled. (State = 0)\n", exe: exe, want: CheckOK, says: "off"},
		{name: "on, macfleet allowed", global: "Firewall is enabled. (State = 1)\n", stealth: "Firewall stealth mode is off\n",
			app: "The application " + exe + " is permitted\n", exe: exe, want: CheckOK, says: exe + " may accept", notSays: "stealth"},
		{name: "on, macfleet blocked, stealth", global: "Firewall is enabled. (State = 1)\n", stealth: "Firewall stealth mode is on\n",
			app: "The application " + exe + " is blocked\n", exe: exe, want: CheckWarn, says: "stealth mode on", fixHas: "--unblockapp " + exe},
		{name: "on, macfleet unknown", global: "Firewall is enabled. (State = 1)\n", app: "The application is not part of the firewall\n",
			exe: exe, want: CheckWarn, says: "macOS asks on the first connection", fixHas: "--add " + exe},
		{name: "block all", global: "Firewall is blocking all non-essential incoming connections. (State = 2)\n", exe: exe,
			want: CheckWarn, says: "blocks all", fixHas: "Block all incoming connections"},
		{name: "tool failed", globalErr: errors.New("exit status 1"), exe: exe, want: CheckUnavailable},
		{name: "on, the binary's state unreadable", global: "Firewall is enabled. (State = 1)\n", appErr: errors.New("exit status 1"),
			exe: exe, want: CheckWarn, says: "could not be read: exit status 1", fixHas: "--unblockapp " + exe},
		{name: "unreadable answer", global: "something else\n", exe: exe, want: CheckUnavailable, says: "something else"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := FirewallCheck([]byte(tt.global), tt.globalErr, []byte(tt.stealth), FirewallApp{Path: tt.exe, Answer: []byte(tt.app), Err: tt.appErr})
			if c.Check != tt.want || !strings.Contains(c.Result, tt.says) || !strings.Contains(c.Fix, tt.fixHas) ||
				(tt.notSays != "" && strings.Contains(c.Result, tt.notSays)) {
				t.Errorf("FirewallCheck = %+v; want %s saying %q (not %q), fix with %q", c, tt.want, tt.says, tt.notSays, tt.fixHas)
			}
		})
	}
}

// TestMacChecks: on macOS the checks read pmset and socketfilterfw (canned here);
// elsewhere they say they were skipped.
func TestMacChecks(t *testing.T) {
	tools := fakeTools{commands: map[string]string{
		"/usr/bin/pmset -g":                                  pmsetServer,
		SocketFilterFW + " --getglobalstate":                 "Firewall is enabled. (State = 1)\n",
		SocketFilterFW + " --getstealthmode":                 "Firewall stealth mode is off\n",
		SocketFilterFW + " --getappblocked /usr/local/bin/m": "The application /usr/local/bin/m is permitted\n",
	}}
	var got []string
	for _, c := range macChecks(t.Context(), "darwin", tools, "/usr/local/bin/m") {
		got = append(got, c.Name+" "+string(c.Check))
	}
	if diff := cmp.Diff([]string{"sleep ok", "restart after power loss ok", "firewall ok"}, got); diff != "" {
		t.Errorf("darwin (-want +got):\n%s", diff)
	}
	for _, c := range macChecks(t.Context(), "linux", tools, "/usr/local/bin/m") {
		if c.Check != CheckSkipped || c.Result != "skipped (not macOS)" {
			t.Errorf("linux: %+v", c)
		}
	}
}

// writeKubeconfig writes a kubeconfig for server with the CA of ca (PEM) and, when
// given, a TLS server name.
func writeKubeconfig(t *testing.T, server string, ca []byte, serverName string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca, TLSServerName: serverName}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	path := filepath.Join(t.TempDir(), "node.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func caOf(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// TestClusterCheck dials real TLS listeners on loopback as the agent's credential
// names them.
func TestClusterCheck(t *testing.T) {
	apiServer := httptest.NewTLSServer(http.NotFoundHandler())
	defer apiServer.Close()
	otherCA, err := pki.NewCA(time.Now(), time.Hour) // another cluster's
	if err != nil {
		t.Fatal(err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "https://" + closed.Addr().String()
	closed.Close()
	tests := []struct {
		name       string
		kubeconfig string
		want       Check
		says, fix  string
	}{
		{name: "reached and verified", kubeconfig: writeKubeconfig(t, apiServer.URL, caOf(apiServer), ""), want: CheckOK,
			says: "certificate verified"},
		{name: "another cluster's CA", kubeconfig: writeKubeconfig(t, apiServer.URL, pki.EncodeCerts(otherCA.Cert), ""), want: CheckFailed,
			fix: "not signed by the kubeconfig's CA"},
		{name: "a name the certificate lacks", kubeconfig: writeKubeconfig(t, apiServer.URL, caOf(apiServer), "api.office.lan"),
			want: CheckFailed, fix: "does not name"},
		{name: "nothing listens", kubeconfig: writeKubeconfig(t, closedURL, caOf(apiServer), ""), want: CheckFailed,
			fix: "nothing listens there"},
		{name: "no kubeconfig", want: CheckSkipped},
		{name: "unreadable kubeconfig", kubeconfig: filepath.Join(t.TempDir(), "missing"), want: CheckFailed, says: "reading"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ClusterCheck(t.Context(), tt.kubeconfig, 5*time.Second)
			if c.Check != tt.want || !strings.Contains(c.Result, tt.says) || !strings.Contains(c.Fix, tt.fix) {
				t.Errorf("ClusterCheck = %+v; want %s saying %q, fix with %q", c, tt.want, tt.says, tt.fix)
			}
		})
	}
}

func TestDialFix(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "api.lan", IsNotFound: true}}, "cannot resolve"},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, "nothing listens"},
		{context.DeadlineExceeded, "VPN or a tunnel"},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, "no route"},
		{errors.New("something"), "check the address"},
	} {
		if got := DialFix(tt.err); !strings.Contains(got, tt.want) {
			t.Errorf("DialFix(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// TestAgentPortCheck: a free port is free, one held by a TLS server (the agent) is
// the agent's, one held by anything else fails the report.
func TestAgentPortCheck(t *testing.T) {
	agent := httptest.NewTLSServer(http.NotFoundHandler())
	defer agent.Close()
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() { // answers as a plain HTTP server would, then hangs up
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	for _, tt := range []struct {
		name, listen string
		want         Check
		says         string
	}{
		{"free", freeAddr, CheckOK, "is free for the agent; the cluster dials 192.0.2.7:8080"},
		{"the agent", agent.Listener.Addr().String(), CheckOK, "in use by a TLS server"},
		{"another program", plain.Addr().String(), CheckFailed, "does not answer TLS"},
		{"not an address", "8080", CheckFailed, "--listen"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := AgentPortCheck(t.Context(), tt.listen, "192.0.2.7:8080", 5*time.Second)
			if c.Check != tt.want || !strings.Contains(c.Result, tt.says) {
				t.Errorf("AgentPortCheck(%s) = %+v; want %s saying %q", tt.listen, c, tt.want, tt.says)
			}
		})
	}
}
