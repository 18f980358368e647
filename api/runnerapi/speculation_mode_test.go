package runnerapi

import "testing"

func TestSpeculationMode(t *testing.T) {
	for in, want := range map[string]string{
		"": SpeculationAuto, "off": SpeculationOff, " OFF ": SpeculationOff, "on": SpeculationOn, "On": SpeculationOn,
		"auto": SpeculationAuto, "yes": SpeculationAuto,
	} {
		if got := SpeculationMode(in); got != want {
			t.Errorf("SpeculationMode(%q) = %q, want %q", in, got, want)
		}
	}
}
