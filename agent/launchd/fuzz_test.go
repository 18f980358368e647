package launchd

import (
	"fmt"
	"testing"
)

// FuzzParse: any input either fails or gives a dictionary holding only the value
// types Parse documents.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>Label</key><string>dev.macfleet.agent</string>` +
		`<key>ProgramArguments</key><array><string>/usr/local/bin/macfleet</string><string>agent</string></array>` +
		`<key>RunAtLoad</key><true/><key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>` +
		`<key>ThrottleInterval</key><integer>10</integer></dict></plist>`))
	f.Add([]byte(`<plist><dict><key>a</key><integer>-9223372036854775808</integer></dict></plist>`))
	f.Add([]byte(`<plist><array/></plist>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if m == nil {
			t.Fatal("Parse returned neither a dictionary nor an error")
		}
		if err := documented(m); err != nil {
			t.Fatalf("Parse(%q): %v", data, err)
		}
	})
}

func documented(v any) error {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			if err := documented(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range v {
			if err := documented(e); err != nil {
				return err
			}
		}
	case string, int64, bool:
	default:
		return fmt.Errorf("a value of type %T", v)
	}
	return nil
}
