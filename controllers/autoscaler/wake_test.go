package autoscaler

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestWoken(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
	for _, tc := range []struct {
		name  string
		value *string
		want  bool
	}{
		{"no annotation", nil, false},
		{"just written", ptr.To(at(0)), true},
		{"renewed a period ago", ptr.To(at(-v1alpha1.WakeRenewInterval)), true},
		{"just within the hold", ptr.To(at(-v1alpha1.WakeHold + time.Millisecond)), true},
		{"the hold over", ptr.To(at(-v1alpha1.WakeHold)), false},
		{"long ago", ptr.To(at(-time.Hour)), false},
		{"a gateway clock ahead", ptr.To(at(v1alpha1.WakeHold - time.Second)), true},
		{"a gateway clock far ahead", ptr.To(at(v1alpha1.WakeHold)), false},
		{"seconds precision", ptr.To(now.Add(-2 * time.Second).Format(time.RFC3339)), true},
		{"not a time", ptr.To("soon"), false},
		{"empty", ptr.To(""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := &v1alpha1.ModelDeployment{}
			if tc.value != nil {
				md.ObjectMeta = metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationWakeRequested: *tc.value}}
			}
			if got, _ := Woken(md, now); got != tc.want {
				t.Errorf("Woken with %v = %v, want %v", tc.value, got, tc.want)
			}
		})
	}
}
