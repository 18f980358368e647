{{/* Chart name and version, as in the helm.sh/chart label. */}}
{{- define "macfleet.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object the chart installs. */}}
{{- define "macfleet.labels" -}}
helm.sh/chart: {{ include "macfleet.chart" . }}
app.kubernetes.io/name: macfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "manager"). */}}
{{- define "macfleet.selectorLabels" -}}
app.kubernetes.io/name: macfleet
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects and pods: (dict "root" $ "component" "manager"). */}}
{{- define "macfleet.componentLabels" -}}
{{ include "macfleet.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image of the manager and the gateway. */}}
{{- define "macfleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Whether the manager elects a leader: only when it runs more than one replica. */}}
{{- define "macfleet.manager.leaderElect" -}}
{{ gt (int .Values.manager.replicas) 1 }}
{{- end }}

{{/* The gateway's tunnel listener as the manager dials it (--gateway-tunnel): the
Service macfleet-gateway-tunnel in the release namespace and its port; empty when the
gateway takes no tunnels. */}}
{{- define "macfleet.gateway.tunnelAddress" -}}
{{- if and .Values.gateway.enabled .Values.gateway.tunnel.enabled -}}
macfleet-gateway-tunnel.{{ .Release.Namespace }}.svc:{{ .Values.gateway.tunnel.service.port }}
{{- end -}}
{{- end }}
