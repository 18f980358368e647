package enginepool

import (
	"reflect"
	"testing"

	apiengine "github.com/macfleet/macfleet/api/engine"
)

// TestEngineIdentityCoversEverySetting: changing any engine setting of a model but its
// threads marks its running engine for a restart (PendingRestart). A new field of
// engine.Settings fails here until engineIdentity counts it (or it is listed as one a
// running engine does not depend on).
func TestEngineIdentityCoversEverySetting(t *testing.T) {
	noRestart := map[string]bool{"Threads": true}
	base := ModelSpec{Name: "m", Engine: apiengine.Settings{ContextLength: 1024, Parallel: 2, KVCacheType: apiengine.KVCacheF16, Threads: 2}}
	typ := reflect.TypeFor[apiengine.Settings]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		changed := base
		v := reflect.ValueOf(&changed.Engine).Elem().Field(i)
		switch v.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.String:
			v.SetString(v.String() + "-changed")
		default:
			t.Fatalf("engine setting %s: a %s; teach this test to change it", f.Name, v.Kind())
		}
		if got, want := needsRestart(base, changed), !noRestart[f.Name]; got != want {
			t.Errorf("changing engine setting %s: needsRestart = %v, want %v", f.Name, got, want)
		}
	}
}
