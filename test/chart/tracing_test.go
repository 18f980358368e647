package chart

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// TestTemplateGatewayTracing: the gateway gets the standard OTEL_* variables only when
// an OTLP endpoint is set, plus any extra environment, after POD_NAME (its name in its
// usage records); a bad endpoint or ratio is a schema error.
func TestTemplateGatewayTracing(t *testing.T) {
	podName := corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}
	for _, tc := range []struct {
		name string
		set  []string
		want []corev1.EnvVar
	}{
		{name: "off by default", want: []corev1.EnvVar{podName}},
		{name: "endpoint and ratio", set: []string{"gateway.tracing.otlpEndpoint=http://otel-collector.observability:4318",
			"gateway.tracing.samplerRatio=0.25", "gateway.env[0].name=OTEL_EXPORTER_OTLP_HEADERS", "gateway.env[0].value=x-tenant=fleet"},
			want: []corev1.EnvVar{
				podName,
				{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.observability:4318"},
				{Name: "OTEL_TRACES_SAMPLER", Value: "parentbased_traceidratio"},
				{Name: "OTEL_TRACES_SAMPLER_ARG", Value: "0.25"},
				{Name: "OTEL_EXPORTER_OTLP_HEADERS", Value: "x-tenant=fleet"},
			}},
		{name: "extra environment alone", set: []string{"gateway.env[0].name=GODEBUG", "gateway.env[0].value=madvdontneed=1"},
			want: []corev1.EnvVar{podName, {Name: "GODEBUG", Value: "madvdontneed=1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := findDeployment(t, render(t, tc.set...), "macfleet-gateway")
			if diff := cmp.Diff(tc.want, d.Spec.Template.Spec.Containers[0].Env); diff != "" {
				t.Errorf("gateway env (-want +got):\n%s", diff)
			}
		})
	}
	for set, want := range map[string]string{
		"gateway.tracing.otlpEndpoint=otel-collector:4318": "gateway/tracing/otlpEndpoint",
		"gateway.tracing.samplerRatio=1.5":                 "gateway/tracing/samplerRatio",
		"gateway.tracing.samplerRatio=2":                   "gateway/tracing/samplerRatio",
		"gateway.tracing.endpoint=http://x:4318":           "endpoint",
	} {
		if _, err := helm(t, "template", "macfleet", chartDir(t), "--set", set); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("helm template --set %s = %v; want a schema error naming %s", set, err, want)
		}
	}
}
