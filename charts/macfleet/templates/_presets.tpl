{{- /*
The annotations of gateway.access.preset (values.yaml, "preset"; docs/fleet.md, "Load
balancer presets"): each template returns a YAML map, empty for a preset that needs
none there.
*/}}

{{- /* macfleet.presetIngressAnnotations: the Ingress's, for the AWS Load Balancer
Controller: an ALB idle timeout as long as a stream may last (its default of 60 s cuts
a silent one), targets by pod IP (the Service is a ClusterIP), and /readyz on the probe
port as the health check (the API's / is a 404). */}}
{{- define "macfleet.presetIngressAnnotations" -}}
{{- $gw := .Values.gateway }}
{{- if eq $gw.access.preset "aws-alb" }}
alb.ingress.kubernetes.io/load-balancer-attributes: idle_timeout.timeout_seconds={{ int $gw.access.timeoutSeconds }}
alb.ingress.kubernetes.io/target-type: ip
alb.ingress.kubernetes.io/listen-ports: '[{"HTTPS":443}]'
alb.ingress.kubernetes.io/healthcheck-path: /readyz
alb.ingress.kubernetes.io/healthcheck-port: {{ $gw.probePort | quote }}
alb.ingress.kubernetes.io/backend-protocol: {{ ternary "HTTPS" "HTTP" (and $gw.tls.terminate true) }}
{{- else }}
{}
{{- end }}
{{- end }}

{{- /* macfleet.presetServiceAnnotations: the Service's, for GKE's Ingress: the
BackendConfig macfleet-gateway for its port, reached through network endpoint groups
(pod IPs), and HTTPS to the gateway when it terminates TLS itself. */}}
{{- define "macfleet.presetServiceAnnotations" -}}
{{- $gw := .Values.gateway }}
{{- if and (eq $gw.access.preset "gke") $gw.access.ingress.enabled }}
cloud.google.com/backend-config: '{"default":"macfleet-gateway"}'
cloud.google.com/neg: '{"ingress":true}'
{{- if $gw.tls.terminate }}
cloud.google.com/app-protocols: '{"http":"HTTPS"}'
{{- end }}
{{- else }}
{}
{{- end }}
{{- end }}
