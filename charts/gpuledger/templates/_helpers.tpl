{{/* Helm's bookkeeping labels: on every object's metadata, never in a selector */}}
{{- define "gpuledger.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* the labels of the base install (manifests/ in the kustomize tree) */}}
{{- define "gpuledger.baseLabels" -}}
app.kubernetes.io/name: gpuledger
app.kubernetes.io/part-of: gpuledger
{{ include "gpuledger.helmLabels" . }}
{{- end }}

{{- define "gpuledger.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* the webhook Service's DNS names, as the serving certificate must carry them */}}
{{- define "gpuledger.dnsNames" -}}
- gpuledger
- gpuledger.{{ .Release.Namespace }}
- gpuledger.{{ .Release.Namespace }}.svc
- gpuledger.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/* restricted Pod Security: the pod-level securityContext every pod here uses */}}
{{- define "gpuledger.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gpuledger.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* generate mode: one CA and serving certificate per install, reused from the live Secret on upgrade */}}
{{- define "gpuledger.generatedTLS" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace "gpuledger-tls" -}}
{{- if and $existing (index $existing.data "ca.crt") -}}
ca.crt: {{ index $existing.data "ca.crt" }}
tls.crt: {{ index $existing.data "tls.crt" }}
tls.key: {{ index $existing.data "tls.key" }}
{{- else -}}
{{- $ca := genCA "gpuledger-ca" 3650 -}}
{{- $names := list "gpuledger" (printf "gpuledger.%s" .Release.Namespace) (printf "gpuledger.%s.svc" .Release.Namespace) (printf "gpuledger.%s.svc.cluster.local" .Release.Namespace) -}}
{{- $cert := genSignedCert (printf "gpuledger.%s.svc" .Release.Namespace) nil $names 825 $ca -}}
ca.crt: {{ $ca.Cert | b64enc }}
tls.crt: {{ $cert.Cert | b64enc }}
tls.key: {{ $cert.Key | b64enc }}
{{- end -}}
{{- end }}
