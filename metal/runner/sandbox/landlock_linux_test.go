package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// probeEnv, set, makes TestSandboxProbe the probe: it tries every access of a
// probeResult and prints the outcome as JSON.
const probeEnv = "SANDBOX_TEST_PROBE"

type probeRequest struct {
	Secret, Model, CacheDir, SocketDir, Dial, OtherSocket, Collector string
	// Worker is the address a split head's runner may connect to.
	Worker    string
	ParentPID int
}

// probeResult holds the error of each attempt, "" for success.
type probeResult struct {
	ReadSecret, ReadModel, WriteCache, ListenSocket, ReadProcSelf, ReadParentEnviron string
	DialTCP, DialMPTCP, ListenTCP, ListenMPTCP, UDP, DialUnix, UnixDatagram          string
	DialCollector                                                                    string
	DialWorker                                                                       string
	// OTELEnv lists the OTEL_* variables the process got.
	OTELEnv []string
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestSandboxProbe is not a test: it is the program TestLandlock runs confined.
func TestSandboxProbe(t *testing.T) {
	enc := os.Getenv(probeEnv)
	if enc == "" {
		t.Skip("only run confined by TestLandlock")
	}
	var req probeRequest
	if err := json.Unmarshal([]byte(enc), &req); err != nil {
		t.Fatal(err)
	}
	var res probeResult
	_, err := os.ReadFile(req.Secret)
	res.ReadSecret = errString(err)
	_, err = os.ReadFile(req.Model)
	res.ReadModel = errString(err)
	res.WriteCache = errString(os.WriteFile(filepath.Join(req.CacheDir, "state"), []byte("x"), 0o600))
	if ln, err := net.Listen("unix", filepath.Join(req.SocketDir, "r.sock")); err != nil {
		res.ListenSocket = err.Error()
	} else {
		ln.Close()
	}
	for _, mp := range []bool{false, true} {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(mp)
		c, err := d.Dial("tcp", req.Dial)
		if err == nil {
			c.Close()
		}
		var lc net.ListenConfig
		lc.SetMultipathTCP(mp)
		ln, lerr := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if lerr == nil {
			ln.Close()
		}
		if mp {
			res.DialMPTCP, res.ListenMPTCP = errString(err), errString(lerr)
		} else {
			res.DialTCP, res.ListenTCP = errString(err), errString(lerr)
		}
	}
	if req.Collector != "" {
		c, err := net.DialTimeout("tcp", req.Collector, 5*time.Second)
		if err == nil {
			c.Close()
		}
		res.DialCollector = errString(err)
	}
	if req.Worker != "" {
		c, err := net.DialTimeout("tcp", req.Worker, 5*time.Second)
		if err == nil {
			c.Close()
		}
		res.DialWorker = errString(err)
	}
	if c, err := net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
		res.UDP = err.Error()
	} else {
		c.Close()
	}
	if c, err := net.Dial("unix", req.OtherSocket); err != nil {
		res.DialUnix = err.Error()
	} else {
		c.Close()
	}
	if c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(req.SocketDir, "d.sock"), Net: "unixgram"}); err != nil {
		res.UnixDatagram = err.Error()
	} else {
		c.Close()
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") {
			res.OTELEnv = append(res.OTELEnv, kv)
		}
	}
	_, err = os.ReadFile("/proc/self/status")
	res.ReadProcSelf = errString(err)
	_, err = os.ReadFile(filepath.Join("/proc", strconv.Itoa(req.ParentPID), "environ"))
	res.ReadParentEnviron = errString(err)
	b, _ := json.Marshal(res)
	os.Stdout.Write(append([]byte("PROBE "), append(b, '\n')...))
}

// TestLandlock runs this test binary as a runner confined by Wrap and checks what it
// may touch: its model, cache and socket directories, its own /proc entries; not a
// secret beside them, not the network, not its parent's environment.
func TestLandlock(t *testing.T) {
	if st := Probe(); !st.Enforced {
		t.Skipf("no Landlock here: %s", st.Detail)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	secret := filepath.Join(dir, "kubeconfig")
	model := filepath.Join(dir, "model.gguf")
	for _, f := range []string{secret, model} {
		if err := os.WriteFile(f, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Another runner's socket, in a directory of its own.
	other := filepath.Join(dir, "other", "r.sock")
	if err := os.MkdirAll(filepath.Dir(other), 0o700); err != nil {
		t.Fatal(err)
	}
	uln, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer uln.Close()
	collector, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Close()

	// A split head's worker, through the agent's split link: the one port it may reach.
	worker, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()

	for _, tc := range []struct {
		name      string
		loopback  bool
		tracing   bool
		splitHead bool
		want      func(probeResult) error
	}{
		{"unix socket", false, false, false, func(r probeResult) error {
			if r.ListenTCP == "" || r.ListenMPTCP == "" {
				return errors.New("a runner on a unix socket could listen on TCP")
			}
			return nil
		}},
		{"loopback", true, false, false, func(r probeResult) error {
			if r.ListenTCP != "" {
				return errors.New("a loopback runner could not listen on TCP: " + r.ListenTCP)
			}
			return nil
		}},
		// With tracing on in the agent's environment, a runner is confined the same:
		// it reaches neither the collector's port nor any unix socket (checked for
		// every case below), and gets no OTEL_* variable; its spans leave through the
		// agent (internal/tracing/spanrelay).
		{"tracing", false, true, false, func(r probeResult) error {
			if !strings.Contains(r.DialCollector, syscall.EACCES.Error()) && !strings.Contains(r.DialCollector, syscall.EPERM.Error()) {
				return errors.New("a tracing runner's dial to the collector: want permission denied, got " + strconv.Quote(r.DialCollector))
			}
			if len(r.OTELEnv) > 0 {
				return fmt.Errorf("a tracing runner got the agent's tracing settings %q", r.OTELEnv)
			}
			if r.ListenTCP == "" {
				return errors.New("a tracing runner could listen on TCP")
			}
			return nil
		}},
		// A split replica's head reaches its workers' loopback ports and nothing else
		// (the dial to another port, Multipath TCP and UDP are refused, checked below).
		{"split head", false, false, true, func(r probeResult) error {
			if r.DialWorker != "" {
				return errors.New("a split head could not connect to its worker: " + r.DialWorker)
			}
			if r.ListenTCP == "" {
				return errors.New("a split head could listen on TCP")
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Runner: exe, Model: model, CacheDir: filepath.Join(dir, tc.name, "cache"),
				SocketDir: filepath.Join(dir, tc.name, "sock"), Loopback: tc.loopback}
			req := probeRequest{Secret: secret, Model: model, CacheDir: p.CacheDir, SocketDir: p.SocketDir,
				Dial: ln.Addr().String(), OtherSocket: other, ParentPID: os.Getpid()}
			if tc.splitHead {
				p.ConnectPorts = []uint16{uint16(worker.Addr().(*net.TCPAddr).Port)}
				req.Worker = worker.Addr().String()
			}
			if tc.tracing {
				// The agent's environment turns tracing on, the collector beside it.
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+collector.Addr().String())
				t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=collector-secret")
				req.Collector = collector.Addr().String()
			}
			if err := os.MkdirAll(p.SocketDir, 0o700); err != nil {
				t.Fatal(err)
			}
			res := runProbe(t, exe, p, req)
			denied := func(what, e string) {
				if !strings.Contains(e, syscall.EACCES.Error()) && !strings.Contains(e, syscall.EPERM.Error()) {
					t.Errorf("%s: want permission denied, got %q", what, e)
				}
			}
			denied("reading the secret", res.ReadSecret)
			denied("dialing TCP", res.DialTCP)
			denied("dialing Multipath TCP", res.DialMPTCP)
			denied("UDP", res.UDP)
			if !tc.splitHead || landlockABI() >= 9 {
				// A split head may connect(2); before Landlock ABI 9 nothing keeps that
				// from unix sockets.
				denied("dialing another runner's socket", res.DialUnix)
			}
			denied("a unix datagram socket", res.UnixDatagram)
			denied("reading the parent's environ", res.ReadParentEnviron)
			for what, e := range map[string]string{"reading the model": res.ReadModel, "writing the cache": res.WriteCache,
				"listening on the socket": res.ListenSocket, "reading /proc/self": res.ReadProcSelf} {
				if e != "" {
					t.Errorf("%s: %s", what, e)
				}
			}
			if err := tc.want(res); err != nil {
				t.Error(err)
			}
		})
	}
}

// runProbe runs this test binary's TestSandboxProbe confined by p and returns what it
// got.
func runProbe(t *testing.T, exe string, p Policy, req probeRequest) probeResult {
	t.Helper()
	enc, _ := json.Marshal(req)
	cmd := exec.Command(exe, "-test.run=^TestSandboxProbe$", "-test.v")
	cmd.Env = Env(os.Environ(), []string{probeEnv + "=" + string(enc)})
	if err := Wrap(cmd, p); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	var res probeResult
	_, line, ok := strings.Cut(out.String(), "PROBE ")
	if !ok {
		t.Fatalf("no probe result in %s\nstderr: %s", out.String(), errb.String())
	}
	if err := json.Unmarshal([]byte(strings.SplitN(line, "\n", 2)[0]), &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	return res
}

// landlockABI is the kernel's Landlock ABI version (0 without Landlock).
func landlockABI() int {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return abi
}
