package standalone

import (
	"strings"
	"testing"
)

func TestCheckExposure(t *testing.T) {
	tests := []struct {
		listen           string
		hasKey, insecure bool
		refused          bool
	}{
		{listen: "127.0.0.1:8080"},
		{listen: "[::1]:8080"},
		{listen: "localhost:8080"},
		{listen: "127.0.0.2:8080"},
		{listen: "0.0.0.0:8080", refused: true},
		{listen: ":8080", refused: true},
		{listen: "[::]:8080", refused: true},
		{listen: "192.168.1.20:8080", refused: true},
		{listen: "mymac.local:8080", refused: true},
		{listen: "0.0.0.0:8080", hasKey: true},
		{listen: "0.0.0.0:8080", insecure: true},
	}
	for _, tt := range tests {
		err := CheckExposure(tt.listen, tt.hasKey, tt.insecure)
		if (err != nil) != tt.refused {
			t.Errorf("CheckExposure(%q, key %v, insecure %v) = %v, want refused %v", tt.listen, tt.hasKey, tt.insecure, err, tt.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), "--api-key") || !strings.Contains(err.Error(), "--insecure")) {
			t.Errorf("the refusal %q names neither fix", err)
		}
	}
}
