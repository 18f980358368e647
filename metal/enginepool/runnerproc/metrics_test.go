package runnerproc

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// TestMetricsExportRunnerSandbox checks macfleet_agent_runner_sandboxed for a pool of
// runner processes, sandbox on and off.
func TestMetricsExportRunnerSandbox(t *testing.T) {
	st := sandbox.Probe()
	mechanism, enforced := st.Mechanism, "0"
	if mechanism == "" {
		mechanism = "none"
	}
	if st.Enforced {
		enforced = "1"
	}
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode sandbox.Mode
		want string
	}{
		{"", `macfleet_agent_runner_sandboxed{mechanism="` + mechanism + `",mode="on"} ` + enforced},
		{sandbox.Off, `macfleet_agent_runner_sandboxed{mechanism="none",mode="off"} 0`},
	} {
		p, err := enginepool.New(enginepool.Config{}, NewProcessFactory(ProcessConfig{Sandbox: tc.mode}), gauge, nil, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		want := "# HELP macfleet_agent_runner_sandboxed 1 when runners are confined, 0 when the sandbox is off or unavailable, " +
			"with the mode and the mechanism (landlock, seatbelt, seccomp, or none).\n# TYPE macfleet_agent_runner_sandboxed gauge\n" + tc.want + "\n"
		if err := testutil.CollectAndCompare(enginepool.NewMetrics(p), strings.NewReader(want), enginepool.MetricRunnerSandbox); err != nil {
			t.Errorf("sandbox %q: %v", tc.mode, err)
		}
	}
}
