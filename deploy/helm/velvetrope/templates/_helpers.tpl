{{/* Chart name, possibly overridden. */}}
{{- define "velvetrope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: release-chart, unless the release name already has it. */}}
{{- define "velvetrope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "velvetrope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "velvetrope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "velvetrope.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "velvetrope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The gateway config as rendered into the ConfigMap: .Values.config, plus admin_token_env
when an admin Secret is configured.  listen is set on the command line.
*/}}
{{- define "velvetrope.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if .Values.adminToken.existingSecret -}}
{{- $_ := set $cfg "admin_token_env" .Values.adminToken.envName -}}
{{- end -}}
{{- $state := deepCopy (default dict $cfg.state) -}}
{{- if .Values.redis.url -}}
{{- $_ := set $state "url" .Values.redis.url -}}
{{- else if .Values.redis.enabled -}}
{{- $_ := set $state "url" (printf "redis://%s-redis:6379/0" (include "velvetrope.fullname" .)) -}}
{{- end -}}
{{- if .Values.redis.passwordSecret -}}
{{- $_ := set $state "password_env" "VELVETROPE_REDIS_PASSWORD" -}}
{{- end -}}
{{- /* Before Redis ever answers, fail_open divides limits by this many replicas. */ -}}
{{- if and (ne (default "memory://" $state.url) "memory://") (not (hasKey $state "expected_replicas")) -}}
{{- $_ := set $state "expected_replicas" (int .Values.replicaCount) -}}
{{- end -}}
{{- $_ := set $cfg "state" $state -}}
{{- toYaml $cfg -}}
{{- end -}}
