{{/* Chart name, shortened to the 63 characters a label value allows. */}}
{{- define "genrm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: the release name, suffixed with the chart name unless it already contains it. */}}
{{- define "genrm-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "genrm-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that never change for the life of the release: the Deployment selector. */}}
{{- define "genrm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "genrm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Recommended labels on every object, plus the user's commonLabels. */}}
{{- define "genrm-operator.labels" -}}
helm.sh/chart: {{ include "genrm-operator.chart" . }}
{{ include "genrm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: genrm-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Object annotations as YAML: extra ones plus commonAnnotations; empty when none (argument: dict root, extra). */}}
{{- define "genrm-operator.annotations" -}}
{{- with merge (deepCopy (default dict .extra)) .root.Values.commonAnnotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "genrm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "genrm-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag (tag defaults to appVersion) or repository@digest. */}}
{{- define "genrm-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Fail loudly when a Prometheus Operator object is enabled but its CRD is not served: silently
rendering nothing would leave users without metrics and without a hint (argument: list root kind).
*/}}
{{- define "genrm-operator.requirePrometheusOperator" -}}
{{- $root := index . 0 }}
{{- $kind := index . 1 }}
{{- if not ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) }}
{{- fail (printf "%s is enabled but the cluster does not serve monitoring.coreos.com/v1 %s: install the Prometheus Operator CRDs first (with `helm template`, pass --api-versions monitoring.coreos.com/v1/%s)" $kind $kind $kind) }}
{{- end }}
{{- end }}
