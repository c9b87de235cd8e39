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

{{/* The Redis pods' selector labels (their own name: the gateway's Service never selects them). */}}
{{- define "velvetrope.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "velvetrope.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* "true" when the in-chart Redis is deployed: enabled, and no config.state.url of yours. */}}
{{- define "velvetrope.inChartRedis" -}}
{{- if and .Values.redis.enabled (not (dig "state" "url" "" .Values.config)) -}}true{{- end -}}
{{- end -}}

{{/*
The state URL, by precedence (values.yaml, `redis`): config.state.url, else the in-chart
Redis when enabled, else memory://.
*/}}
{{- define "velvetrope.stateUrl" -}}
{{- $url := dig "state" "url" "" .Values.config -}}
{{- if $url -}}
{{- $url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "velvetrope.fullname" .) -}}
{{- else -}}
memory://
{{- end -}}
{{- end -}}

{{/* "true" when the gateway reads a Redis password from redis.passwordSecret. */}}
{{- define "velvetrope.redisPassword" -}}
{{- if and .Values.redis.passwordSecret (ne (include "velvetrope.stateUrl" .) "memory://") -}}true{{- end -}}
{{- end -}}

{{/*
The gateway config as rendered into the ConfigMap: .Values.config, plus admin_token_env
when an admin Secret is configured, and the state URL (velvetrope.stateUrl) with its
password variable and expected_replicas.  listen is set on the command line.
*/}}
{{- define "velvetrope.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if .Values.adminToken.existingSecret -}}
{{- $_ := set $cfg "admin_token_env" .Values.adminToken.envName -}}
{{- end -}}
{{- $state := deepCopy (default dict $cfg.state) -}}
{{- $url := include "velvetrope.stateUrl" . -}}
{{- if ne $url "memory://" -}}
{{- $_ := set $state "url" $url -}}
{{- /* Before Redis ever answers, fail_open divides limits by this many replicas. */ -}}
{{- if not (hasKey $state "expected_replicas") -}}
{{- $_ := set $state "expected_replicas" (int .Values.replicaCount) -}}
{{- end -}}
{{- end -}}
{{- if include "velvetrope.redisPassword" . -}}
{{- $_ := set $state "password_env" "VELVETROPE_REDIS_PASSWORD" -}}
{{- end -}}
{{- $_ := set $cfg "state" $state -}}
{{- toYaml $cfg -}}
{{- end -}}
