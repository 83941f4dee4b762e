{{/* The chart's name, at most 63 characters. */}}
{{- define "meridian.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name when it holds the chart's name, else
RELEASE-CHART; at most 63 characters (a DNS label). */}}
{{- define "meridian.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "meridian.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meridian.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "meridian.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "meridian.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meridian
{{- end -}}

{{- define "meridian.serviceAccountName" -}}
{{- default (include "meridian.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* HOST:PORT for a listener: the listen address, bracketed when it is IPv6. */}}
{{- define "meridian.listen" -}}
{{- $addr := .root.Values.listenAddress -}}
{{- if contains ":" $addr -}}
{{- printf "[%s]:%d" $addr (int .port) -}}
{{- else -}}
{{- printf "%s:%d" $addr (int .port) -}}
{{- end -}}
{{- end -}}

{{/* Where the config file is mounted, and the xDS TLS Secret (side by side: a mount inside
the read-only ConfigMap volume would need a directory made in it). */}}
{{- define "meridian.configDir" -}}/etc/meridian/config{{- end -}}
{{- define "meridian.tlsDir" -}}/etc/meridian/tls{{- end -}}
{{- define "meridian.gatewayTlsDir" -}}/etc/meridian/gateway-tls{{- end -}}
{{- define "meridian.adminTokenDir" -}}/etc/meridian/admin-token{{- end -}}

{{/* Checks the values that the schema cannot relate to each other, with meridian's own
words (src/config.rs would refuse them at start-up). */}}
{{/* The agent Service's DNS names in this cluster (JSON), the default agent.serverNames. */}}
{{- define "meridian.agentServiceNames" -}}
{{- $svc := printf "%s-agent" (include "meridian.fullname" .) -}}
{{- list (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) | toJson -}}
{{- end -}}

{{- define "meridian.checks" -}}
{{- $le := .Values.leaderElection -}}
{{- if ge (int $le.retryPeriodSeconds) (int $le.renewDeadlineSeconds) -}}
{{- fail (printf "leaderElection: retryPeriodSeconds (%v) must be below renewDeadlineSeconds (%v)" $le.retryPeriodSeconds $le.renewDeadlineSeconds) -}}
{{- end -}}
{{- if ge (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds) -}}
{{- fail (printf "leaderElection: renewDeadlineSeconds (%v) must be below leaseDurationSeconds (%v), so a leader stops writing before its lease can be taken over" $le.renewDeadlineSeconds $le.leaseDurationSeconds) -}}
{{- end -}}
{{- if lt (int .Values.xds.debounceMaxMillis) (int .Values.xds.debounceMillis) -}}
{{- fail (printf "xds: debounceMaxMillis (%v) is shorter than debounceMillis (%v)" .Values.xds.debounceMaxMillis .Values.xds.debounceMillis) -}}
{{- end -}}
{{- $ports := list (int .Values.dns.port) (int .Values.xds.port) (int .Values.admin.port) -}}
{{- if .Values.agent.enabled -}}
{{- $ports = append $ports (int .Values.agent.port) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $ports = append $ports (int .Values.gateway.port) -}}
{{- if not .Values.gateway.tls.secretName -}}
{{- fail "gateway.tls {cert, key} is required: the gateway speaks HTTPS only (bearer tokens must not cross in clear): set gateway.tls.secretName" -}}
{{- end -}}
{{- $oidc := .Values.gateway.oidc -}}
{{- if not (and $oidc.issuer $oidc.audiences $oidc.jwks) -}}
{{- fail "gateway.oidc is required: every request is authenticated (issuer, audiences, jwks)" -}}
{{- end -}}
{{- end -}}
{{- if ne (len ($ports | uniq)) (len $ports) -}}
{{- fail (printf "dns.port, xds.port, admin.port (and agent.port, gateway.port) must differ (got %v)" $ports) -}}
{{- end -}}
{{- end -}}
