{{/* Names shared by the webhook's templates (webhook-*.yaml). */}}

{{/* The namespaces the webhook never sees: the configured ones and the release's own, where the webhook
     and the scheduler run (with failurePolicy Fail, the webhook could not otherwise start). */}}
{{- define "gpufrac.webhook.exemptNamespaces" -}}
{{- .Values.webhook.exemptNamespaces | concat (list .Release.Namespace) | uniq | join "," -}}
{{- end }}

{{- define "gpufrac.webhook.hosts" -}}
gpufrac-webhook,gpufrac-webhook.{{ .Release.Namespace }},gpufrac-webhook.{{ .Release.Namespace }}.svc,gpufrac-webhook.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/* cert-manager where the cluster has it and the values allow it; otherwise the one-shot Job. */}}
{{- define "gpufrac.webhook.certManager" -}}
{{- $tls := .Values.webhook.tls -}}
{{- if not (has $tls (list "auto" "cert-manager" "job")) -}}
{{- fail (printf "webhook.tls is %q; choose auto, cert-manager or job" $tls) -}}
{{- end -}}
{{- if or (eq $tls "cert-manager") (and (eq $tls "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end }}

{{/* The CA of the Secret the Job made, so that an upgrade does not blank the caBundle the Job set. */}}
{{- define "gpufrac.webhook.caBundle" -}}
{{- if not (include "gpufrac.webhook.certManager" .) -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace "gpufrac-webhook-tls" -}}
{{- if and $secret $secret.data -}}
{{- index $secret.data "ca.crt" | default "" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "gpufrac.webhook.clientConfig" -}}
clientConfig:
  service:
    name: gpufrac-webhook
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- with include "gpufrac.webhook.caBundle" .root }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}

{{- define "gpufrac.webhook.notExempt" -}}
- key: kubernetes.io/metadata.name
  operator: NotIn
  values: {{- splitList "," (include "gpufrac.webhook.exemptNamespaces" .) | toYaml | nindent 4 }}
{{- end }}

{{/* The trust tier's selector term: sm-sharing only where an admin labelled the namespace trusted. */}}
{{- define "gpufrac.webhook.tier" -}}
{{- if eq . "trusted" -}}
- {key: gpufrac.io/trust, operator: In, values: [trusted]}
{{- else -}}
- {key: gpufrac.io/trust, operator: NotIn, values: [trusted]}
{{- end -}}
{{- end }}

{{- define "gpufrac.webhook.path" -}}
{{ .endpoint }}{{ if eq .tier "trusted" }}/trusted{{ end }}
{{- end }}
