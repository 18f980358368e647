package runnerproc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// TestMetricsExportRunnerSandbox checks macfleet_agent_runner_sandboxed for a pool of
// runner processes, sandbox on and off, and on a machine without the sandbox
// (sandbox.UnavailableEnv), where runners are refused, or allowed unconfined.
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
		mode               sandbox.Mode
		unavailable, allow bool
		want               string
	}{
		{"", false, false, `macfleet_agent_runner_sandboxed{mechanism="` + mechanism + `",mode="on"} ` + enforced},
		{sandbox.Off, false, false, `macfleet_agent_runner_sandboxed{mechanism="none",mode="off"} 0`},
		{"", true, false, `macfleet_agent_runner_sandboxed{mechanism="none",mode="on"} 0`},
		{"", true, true, `macfleet_agent_runner_sandboxed{mechanism="none",mode="allow-unconfined"} 0`},
	} {
		t.Run(string(tc.mode)+fmt.Sprint(tc.unavailable, tc.allow), func(t *testing.T) {
			if tc.unavailable {
				t.Setenv(sandbox.UnavailableEnv, "1")
			}
			p, err := enginepool.New(enginepool.Config{}, NewProcessFactory(ProcessConfig{Sandbox: tc.mode, AllowUnconfined: tc.allow}), gauge, nil, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			want := "# HELP macfleet_agent_runner_sandboxed 1 when runners are confined, 0 when the sandbox is off or unavailable, " +
				"with the mode (on; off; allow-unconfined: unavailable, and runners run unconfined by --allow-unconfined-runners; " +
				"on with 0: unavailable, and runners are refused) and the mechanism (landlock, seatbelt, seccomp, or none).\n" +
				"# TYPE macfleet_agent_runner_sandboxed gauge\n" + tc.want + "\n"
			if err := testutil.CollectAndCompare(enginepool.NewMetrics(p), strings.NewReader(want), enginepool.MetricRunnerSandbox); err != nil {
				t.Errorf("sandbox %q: %v", tc.mode, err)
			}
		})
	}
}
