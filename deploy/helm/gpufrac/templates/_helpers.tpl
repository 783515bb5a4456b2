{{/* Names and labels shared by every gpufrac object. */}}
{{- define "gpufrac.labels" -}}
app.kubernetes.io/name: gpufrac
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpufrac.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The monitoring objects' labels: gpufrac's, and those the Prometheus operator or Grafana selects on. */}}
{{- define "gpufrac.monitoring.labels" -}}
{{ include "gpufrac.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
