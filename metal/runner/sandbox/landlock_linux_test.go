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

	"github.com/google/go-cmp/cmp"
)

// probeEnv, set, makes TestSandboxProbe the probe: it tries every access of a
// probeResult and prints the outcome as JSON.
const probeEnv = "SANDBOX_TEST_PROBE"

type probeRequest struct {
	Secret, Model, CacheDir, SocketDir, Dial, OtherSocket, Collector string
	// Worker is the address a split head's runner may connect to.
	Worker string
	// BackendLib is a backend library, GPUPath a path only a GPU runner may read;
	// OtherSeqpacket is a unix seqpacket socket outside the sandbox.
	BackendLib, GPUPath, OtherSeqpacket string
	ParentPID                           int
}

// probeResult holds the error of each attempt, "" for success.
type probeResult struct {
	ReadSecret, ReadModel, WriteCache, ListenSocket, ReadProcSelf, ReadParentEnviron string
	DialTCP, DialMPTCP, ListenTCP, ListenMPTCP, UDP, DialUnix, UnixDatagram          string
	DialCollector                                                                    string
	DialWorker                                                                       string
	// ReadBackend, MapBackend (mapping it executable, as dlopen does) and ReadGPUPath
	// are the attempts on probeRequest's BackendLib and GPUPath.
	ReadBackend, MapBackend, ReadGPUPath string
	// ListenSeqpacket listens on a unix seqpacket socket at an abstract address, as
	// the CUDA driver does; DialSeqpacket connects to one outside.
	ListenSeqpacket, DialSeqpacket string
	// NameThread writes the name of its thread (/proc/self/task/TID/comm).
	NameThread string
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
	res.ReadBackend, res.MapBackend = errString(readPath(req.BackendLib)), errString(mapExec(req.BackendLib))
	res.ReadGPUPath = errString(readPath(req.GPUPath))
	if ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@macfleet-probe-" + strconv.Itoa(os.Getpid()), Net: "unixpacket"}); err != nil {
		res.ListenSeqpacket = err.Error()
	} else {
		ln.Close()
	}
	res.NameThread = errString(os.WriteFile(fmt.Sprintf("/proc/self/task/%d/comm", syscall.Gettid()), []byte("probe"), 0))
	if c, err := net.Dial("unixpacket", req.OtherSeqpacket); err != nil {
		res.DialSeqpacket = err.Error()
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

// readPath reads a little of the file, or lists the directory, at path.
func readPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		_, err = f.Readdirnames(1)
		return err
	}
	_, err = f.Read(make([]byte, 1))
	return err
}

// mapExec maps the file at path readable and executable, as the dynamic loader maps
// a library's code.
func mapExec(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := syscall.Mmap(int(f.Fd()), 0, 1, syscall.PROT_READ|syscall.PROT_EXEC, syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	return syscall.Munmap(b)
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
	otherSeq := filepath.Join(dir, "other", "p.sock")
	sln, err := net.Listen("unixpacket", otherSeq)
	if err != nil {
		t.Fatal(err)
	}
	defer sln.Close()
	collector, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Close()

	// A GPU runner's backend directory, and one holding ggml's base and CPU
	// libraries only.
	gpuLib, cpuLib := filepath.Join(dir, "gpu", "lib"), filepath.Join(dir, "cpu", "lib")
	for _, f := range []string{filepath.Join(gpuLib, "libggml-test.so"), filepath.Join(cpuLib, "libggml-base.so"),
		filepath.Join(cpuLib, "libggml-cpu-haswell.so")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("\x7fELF"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Where this file system lets no file be mapped executable, not even unconfined,
	// the check is left out.
	mapsHere := mapExec(filepath.Join(gpuLib, "libggml-test.so")) == nil
	// A path this machine has that only a GPU runner may read (none on a machine
	// without any: the check is left out).
	gpuPath := ""
	for _, g := range gpuPaths {
		if found := existing(g.pattern); (g.access == readTree || g.access == readFile) && len(found) > 0 && readPath(found[0]) == nil {
			gpuPath = found[0]
			break
		}
	}
	t.Logf("a path only a GPU runner may read: %q; libraries map executable here: %v", gpuPath, mapsHere)

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
		// abi caps the Landlock ABI (LandlockABIEnv); 0 leaves the kernel's.
		abi int
		// backendDir is the runner's backend directory; a GPU runner's holds a
		// backend library.
		backendDir string
		gpu        bool
		want       func(probeResult) error
	}{
		{name: "unix socket", want: func(r probeResult) error {
			if r.ListenTCP == "" || r.ListenMPTCP == "" {
				return errors.New("a runner on a unix socket could listen on TCP")
			}
			return nil
		}},
		{name: "loopback", loopback: true, want: func(r probeResult) error {
			if r.ListenTCP != "" {
				return errors.New("a loopback runner could not listen on TCP: " + r.ListenTCP)
			}
			return nil
		}},
		// With tracing on in the agent's environment, a runner is confined the same:
		// it reaches neither the collector's port nor any unix socket (checked for
		// every case below), and gets no OTEL_* variable; its spans leave through the
		// agent (internal/tracing/spanrelay).
		{name: "tracing", tracing: true, want: func(r probeResult) error {
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
		{name: "split head", splitHead: true, want: func(r probeResult) error {
			if r.DialWorker != "" {
				return errors.New("a split head could not connect to its worker: " + r.DialWorker)
			}
			if r.ListenTCP == "" {
				return errors.New("a split head could listen on TCP")
			}
			return nil
		}},
		// Under Landlock ABI 3 (the seam's cap) a runner's files are confined as
		// before and the seccomp filter keeps it from connecting (checked below);
		// a split head's connects are held by nothing: the launcher applies what an
		// ABI 3 kernel would, so the head reaches a port that is not its worker's
		// (why the agent refuses such a runner: CheckConnect).
		{name: "unix socket under ABI 3", abi: 3, want: func(probeResult) error { return nil }},
		{name: "split head under ABI 3", abi: 3, splitHead: true, want: func(r probeResult) error {
			if r.DialWorker != "" || r.DialTCP != "" {
				return fmt.Errorf("a split head under Landlock ABI 3 was held (worker %q, another port %q): the seam "+
					"does not apply what an ABI 3 kernel would", r.DialWorker, r.DialTCP)
			}
			return nil
		}},
		// A runner with an accelerator backend reads and maps its backend library
		// and reads what a GPU driver reads (checked below, as every other runner's
		// denial).
		{name: "gpu runner", backendDir: gpuLib, gpu: true, want: func(probeResult) error { return nil }},
		// A backend directory holding only ggml's base and CPU libraries is a CPU
		// runner's: neither it nor a GPU path is granted.
		{name: "backend dir without a backend", backendDir: cpuLib, want: func(probeResult) error { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Runner: exe, Model: model, CacheDir: filepath.Join(dir, tc.name, "cache"),
				SocketDir: filepath.Join(dir, tc.name, "sock"), Loopback: tc.loopback, BackendDir: tc.backendDir}
			req := probeRequest{Secret: secret, Model: model, CacheDir: p.CacheDir, SocketDir: p.SocketDir,
				Dial: ln.Addr().String(), OtherSocket: other, ParentPID: os.Getpid(),
				BackendLib: filepath.Join(gpuLib, "libggml-test.so"), GPUPath: gpuPath, OtherSeqpacket: otherSeq}
			if tc.backendDir == cpuLib {
				req.BackendLib = filepath.Join(cpuLib, "libggml-base.so")
			}
			if tc.abi > 0 {
				if kernelABI() <= tc.abi {
					t.Skipf("the kernel's Landlock ABI %d is not above %d", kernelABI(), tc.abi)
				}
				t.Setenv(LandlockABIEnv, strconv.Itoa(tc.abi))
			}
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
			if !tc.splitHead || tc.abi == 0 {
				denied("dialing TCP", res.DialTCP)
				denied("dialing Multipath TCP", res.DialMPTCP)
			}
			denied("UDP", res.UDP)
			if !tc.splitHead || kernelABI() >= 9 {
				// A split head may connect(2); before Landlock ABI 9 nothing keeps that
				// from unix sockets.
				denied("dialing another runner's socket", res.DialUnix)
			}
			denied("a unix datagram socket", res.UnixDatagram)
			denied("reading the parent's environ", res.ReadParentEnviron)
			denied("dialing a seqpacket socket outside", res.DialSeqpacket)
			if tc.gpu {
				if res.ListenSeqpacket != "" {
					t.Errorf("a GPU runner listening on a unix seqpacket socket: %s", res.ListenSeqpacket)
				}
				if res.NameThread != "" {
					t.Errorf("a GPU runner naming its thread: %s", res.NameThread)
				}
				if res.ReadBackend != "" {
					t.Errorf("a GPU runner reading its backend library: %s", res.ReadBackend)
				}
				if mapsHere && res.MapBackend != "" {
					t.Errorf("a GPU runner mapping its backend library: %s", res.MapBackend)
				}
				if gpuPath != "" && res.ReadGPUPath != "" {
					t.Errorf("a GPU runner reading %s: %s", gpuPath, res.ReadGPUPath)
				}
			} else {
				denied("a unix seqpacket socket", res.ListenSeqpacket)
				denied("naming its thread", res.NameThread)
				denied("reading a backend library", res.ReadBackend)
				if gpuPath != "" {
					denied("reading "+gpuPath, res.ReadGPUPath)
				}
			}
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

// TestLandlockRules checks the grants a runner gets on a machine whose paths are a
// fake's: a GPU runner gets what its card's driver needs, found where it exists; a
// runner without a backend gets exactly a CPU runner's rules on a GPU machine too.
func TestLandlockRules(t *testing.T) {
	cpu := Policy{Runner: "/opt/mf/macfleet-runner", Model: "/models/m.gguf", SocketDir: "/run/mf/s1"}
	gpu := cpu
	gpu.BackendDir = "/opt/mf/lib"
	parts := cpu
	parts.Parts = []string{"/models/parts/h/m-00002-of-00003.gguf", "/models/parts/h/m-00003-of-00003.gguf"}
	nvidia := map[string][]string{
		"/dev/nvidiactl":                              {"/dev/nvidiactl"},
		"/dev/nvidia[0-9]*":                           {"/dev/nvidia0", "/dev/nvidia1"},
		"/dev/nvidia-uvm":                             {"/dev/nvidia-uvm"},
		"/dev/nvidia-uvm-tools":                       {"/dev/nvidia-uvm-tools"}, // the driver never opens it
		"/dev/nvidia-caps/*":                          {"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"},
		"/proc/driver/nvidia":                         {"/proc/driver/nvidia"},
		"/proc/devices":                               {"/proc/devices"},
		"/proc/sys/vm/mmap_min_addr":                  {"/proc/sys/vm/mmap_min_addr"},
		"/sys/devices/system/memory/block_size_bytes": {"/sys/devices/system/memory/block_size_bytes"},
		"/proc/self/task":                             {"/proc/self/task"},
		"/sys/bus/pci/devices":                        {"/sys/bus/pci/devices"},
		"/sys/devices/pci*":                           {"/sys/devices/pci0000:00", "/sys/devices/pci0000:80"},
		"/sys/devices/system/node":                    {"/sys/devices/system/node"},
		"/usr/local/nvidia/lib64":                     {"/usr/local/nvidia/lib64"},
		"/usr/local/cuda*/lib64":                      {"/usr/local/cuda/lib64", "/usr/local/cuda-13.0/lib64"},
	}
	amd := map[string][]string{
		"/dev/kfd":                 {"/dev/kfd"},
		"/dev/dri/renderD*":        {"/dev/dri/renderD128"},
		"/sys/devices/virtual/kfd": {"/sys/devices/virtual/kfd"},
		"/sys/bus/pci/devices":     {"/sys/bus/pci/devices"},
		"/sys/devices/pci*":        {"/sys/devices/pci0000:00"},
	}
	const (
		dev  = "REQUIRE {write_file,read_file,ioctl_dev} for paths "
		tree = "REQUIRE {read_file,read_dir} for paths "
		file = "REQUIRE {read_file} for paths "
		own  = "REQUIRE {write_file,truncate} for paths "
	)
	for _, tc := range []struct {
		name string
		p    Policy
		host map[string][]string
		// want are the rules after a CPU runner's.
		want []string
	}{
		{"cpu runner on an NVIDIA machine", cpu, nvidia, nil},
		{"nvidia", gpu, nvidia, []string{tree + "[/opt/mf/lib]",
			dev + "[/dev/nvidiactl /dev/nvidia0 /dev/nvidia1 /dev/nvidia-uvm " +
				"/dev/nvidia-caps/nvidia-cap1 /dev/nvidia-caps/nvidia-cap2]",
			tree + "[/proc/driver/nvidia /sys/bus/pci/devices /sys/devices/pci0000:00 /sys/devices/pci0000:80 " +
				"/sys/devices/system/node /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64]",
			file + "[/proc/devices /proc/sys/vm/mmap_min_addr /sys/devices/system/memory/block_size_bytes]",
			own + "[/proc/self/task]"}},
		{"amd", gpu, amd, []string{tree + "[/opt/mf/lib]", dev + "[/dev/kfd /dev/dri/renderD128]",
			tree + "[/sys/devices/virtual/kfd /sys/bus/pci/devices /sys/devices/pci0000:00]"}},
		// A backend on a machine without a card: its directory, nothing of a driver.
		{"gpu runner without a card", gpu, nil, []string{tree + "[/opt/mf/lib]"}},
		// A model stored in parts: its other parts, read only (a rule on a link is on
		// the file it resolves to).
		{"model stored in parts", parts, nil, []string{file + "[/models/parts/h/m-00002-of-00003.gguf /models/parts/h/m-00003-of-00003.gguf]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []string
			rules := landlockRules(tc.p, func(pattern string) []string {
				asked = append(asked, pattern)
				return tc.host[pattern]
			})
			base := landlockRules(cpu, func(string) []string { t.Fatal("a CPU runner's rules looked for GPU paths"); return nil })
			if len(rules) < len(base) {
				t.Fatalf("%d rules, fewer than a CPU runner's %d", len(rules), len(base))
			}
			var got []string
			for i, r := range rules {
				if i < len(base) {
					if s, want := fmt.Sprint(r), fmt.Sprint(base[i]); s != want {
						t.Errorf("rule %d is %s, a CPU runner's is %s", i, s, want)
					}
					continue
				}
				got = append(got, fmt.Sprint(r))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("rules after a CPU runner's (-want +got):\n%s", diff)
			}
			if tc.p.BackendDir == "" && len(asked) > 0 {
				t.Errorf("a CPU runner's rules looked for %q", asked)
			}
		})
	}
}

// TestGPUPaths checks the table itself: every pattern is a valid absolute glob (a bad
// one would match nothing, silently), devices are those under /dev, and nothing
// else is written but the runner's own threads.
func TestGPUPaths(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range gpuPaths {
		if _, err := filepath.Match(g.pattern, ""); err != nil || !filepath.IsAbs(g.pattern) {
			t.Errorf("pattern %q: not an absolute glob (%v)", g.pattern, err)
		}
		if seen[g.pattern] {
			t.Errorf("pattern %q listed twice", g.pattern)
		}
		seen[g.pattern] = true
		if isDev := strings.HasPrefix(g.pattern, "/dev/"); isDev != (g.access == device) {
			t.Errorf("pattern %q: device access %v, under /dev %v", g.pattern, g.access == device, isDev)
		}
		if g.access == writeTree && g.pattern != "/proc/self/task" {
			t.Errorf("pattern %q: written, and not the runner's own threads", g.pattern)
		}
	}
}
