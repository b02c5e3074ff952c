{{/* Names, labels and the image. */}}

{{- define "meshca.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<name>, or <release> when it already contains the name. */}}
{{- define "meshca.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "meshca.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "meshca.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshca.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object but the state Secret, whose managed-by label is meshca's. */}}
{{- define "meshca.labels" -}}
{{ include "meshca.baseLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "meshca.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "meshca.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meshca
{{- end -}}

{{- define "meshca.image" -}}
{{- $i := .Values.image -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $i.repository $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $i.repository (default .Chart.AppVersion $i.tag) -}}
{{- end -}}
{{- end -}}

{{- define "meshca.serviceAccountName" -}}
{{- default (include "meshca.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "meshca.rotationServiceAccountName" -}}
{{- printf "%s-root-rotation" (include "meshca.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meshca.stateSecretName" -}}
{{- default (printf "%s-ca-state" (include "meshca.fullname" .)) .Values.state.secret.name -}}
{{- end -}}

{{- define "meshca.stateClaimName" -}}
{{- default (printf "%s-state" (include "meshca.fullname" .)) .Values.state.directory.persistence.existingClaim -}}
{{- end -}}

{{/* Whether the CA state is one `meshca root` rotates: "true" or "". */}}
{{- define "meshca.rotatable" -}}
{{- if has .Values.state.type (list "secret" "directory") }}true{{ end -}}
{{- end -}}

{{/* The store flag of `meshca serve` and `meshca root`. */}}
{{- define "meshca.stateArg" -}}
{{- if eq .Values.state.type "secret" -}}
--state-secret={{ .Release.Namespace }}/{{ include "meshca.stateSecretName" . }}
{{- else if eq .Values.state.type "directory" -}}
--state-dir=/var/lib/meshca
{{- else if eq .Values.state.type "cacerts" -}}
--ca-dir=/etc/cacerts
{{- end -}}
{{- end -}}

{{/*
meshca.seconds: a Go duration ("1h30m", "90s", "1.5h") in seconds, as a
string the caller turns into a float. The schema has already checked the
syntax; JSON schema cannot compare two values, so the templates do.
*/}}
{{- define "meshca.seconds" -}}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" . -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
