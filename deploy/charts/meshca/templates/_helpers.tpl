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

{{/*
The selector of meshca's Deployment, Service and PodDisruptionBudget. No
other Pod the chart makes may carry it: a PodDisruptionBudget's
maxUnavailable counts the replicas of every Pod it matches through their
owner's scale, which a Job has not (the budget then allows no eviction).
*/}}
{{- define "meshca.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshca.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Labels of every object but the state Secret, whose managed-by label is
meshca's, and the root rotation's (meshca.rotationLabels).
*/}}
{{- define "meshca.labels" -}}
{{ include "meshca.baseLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "meshca.baseLabels" -}}
helm.sh/chart: {{ include "meshca.chart" . }}
{{ include "meshca.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meshca
{{- include "meshca.commonLabels" . }}
{{- end -}}

{{/*
commonLabels, on every object the chart renders and its Pods, never in a
selector (meshca.validate refuses the keys the chart sets itself). Starts
with a newline; empty without commonLabels.
*/}}
{{- define "meshca.commonLabels" -}}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Labels of the root-rotation objects and of their Jobs' Pods: the
release's, under a name of their own (<name>-root-rotation), so that they
never match meshca.selectorLabels.
*/}}
{{- define "meshca.rotationLabels" -}}
helm.sh/chart: {{ include "meshca.chart" . }}
app.kubernetes.io/name: {{ printf "%s-root-rotation" (include "meshca.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meshca
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: root-rotation
{{- include "meshca.commonLabels" . }}
{{- end -}}

{{- define "meshca.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image: the HSM build's (upstream.pkcs11.image) for upstream.type pkcs11. */}}
{{- define "meshca.image" -}}
{{- $i := .Values.image -}}
{{- $repo := $i.repository -}}
{{- $digest := $i.digest -}}
{{- if eq .Values.upstream.type "pkcs11" -}}
{{- $repo = .Values.upstream.pkcs11.image.repository -}}
{{- $digest = .Values.upstream.pkcs11.image.digest -}}
{{- end -}}
{{- if $digest -}}
{{- printf "%s@%s" $repo $digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion $i.tag) -}}
{{- end -}}
{{- end -}}

{{- define "meshca.serviceAccountName" -}}
{{- default (include "meshca.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "meshca.rotationServiceAccountName" -}}
{{- printf "%s-root-rotation" (include "meshca.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The signer the ClusterTrustBundle is linked to; empty: none. */}}
{{- define "meshca.clusterTrustBundleSigner" -}}
{{- or .Values.trust.clusterTrustBundle.signerName .Values.podCertificates.signerName -}}
{{- end -}}

{{/*
The name of the ClusterTrustBundle meshca publishes, as
trust.ClusterTrustBundleName computes it from --trust-domain and
--cluster-trust-bundle-signer-name: linked to a signer, its name with '/'
as ':', ':' and the trust domain; else "meshca-" and the trust domain;
an underscore of the trust domain becomes '-'.
*/}}
{{- define "meshca.clusterTrustBundleName" -}}
{{- $td := .Values.ca.trustDomain | replace "_" "-" -}}
{{- with include "meshca.clusterTrustBundleSigner" . -}}
{{- printf "%s:%s" (replace "/" ":" .) $td -}}
{{- else -}}
{{- printf "meshca-%s" $td -}}
{{- end -}}
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

{{/* Whether meshca keeps istiod's certificate (Istio mode): "true" or "". */}}
{{- define "meshca.istiodCert" -}}
{{- if .Values.istio.enabled }}true{{ end -}}
{{- end -}}

{{/* The namespace of istiod and its certificate Secret. */}}
{{- define "meshca.istiodNamespace" -}}
{{- default .Release.Namespace .Values.istio.namespace -}}
{{- end -}}

{{/* istiod's Deployment meshca restarts for new roots, or "". */}}
{{- define "meshca.istiodDeployment" -}}
{{- $d := .Values.istio.istiodDeployment }}
{{- if and (include "meshca.istiodCert" .) $d.restart }}
{{- $rev := .Values.istio.istiodCertificate.revision }}
{{- default (ternary (printf "istiod-%s" $rev) "istiod" (ne $rev "")) $d.name -}}
{{- end }}
{{- end -}}

{{/*
The ValidatingAdmissionPolicy (and its binding) that keeps meshca's patch
of istiod's Deployment to the restart annotation: cluster-scoped, so named
for the release's namespace too.
*/}}
{{- define "meshca.istiodRestartPolicy" -}}
{{- printf "%s.%s.istiod-restart.meshca.io" (include "meshca.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "." -}}
{{- end -}}

{{/* --istiod-cert-secret's value: namespace/name. */}}
{{- define "meshca.istiodCertSecret" -}}
{{- include "meshca.istiodNamespace" . }}/{{ .Values.istio.istiodCertificate.secretName -}}
{{- end -}}

{{/*
Whether meshca writes istio-ca-crl: as asked, else (null) when there are
CRLs to publish (meshca.crlSource) in Istio mode, or when
revocation.enabled makes them and meshca already publishes
istio-ca-root-cert (one switch turns revocation on where meshca is the
mesh's CA); asked with none, meshca.validate fails.
*/}}
{{- define "meshca.crlConfigMaps" -}}
{{- $on := .Values.trust.crlConfigMaps.enabled -}}
{{- if kindIs "invalid" $on -}}
{{- $on = and (include "meshca.crlSource" .) (or .Values.istio.enabled (and .Values.revocation.enabled .Values.trust.rootCertConfigMaps.enabled)) -}}
{{- end -}}
{{- if $on }}true{{ end -}}
{{- end -}}

{{/* Whether there are CRLs to publish: the built-in CA's (meshca.crl), or
Vault's (signer.type vault). */}}
{{- define "meshca.crlSource" -}}
{{- if or (include "meshca.crl" .) (eq .Values.signer.type "vault") }}true{{ end -}}
{{- end -}}

{{/* Whether meshca writes istio-ca-root-cert: Istio mode, or asked alone. */}}
{{/* The CRL keeper (serve --crl): asked for, or istio.enabled, with the
built-in CA on a CA state. */}}
{{- define "meshca.crl" -}}
{{- if and (or .Values.istio.enabled .Values.revocation.enabled) (include "meshca.rotatable" .) (eq .Values.signer.type "local") }}true{{ end -}}
{{- end -}}

{{- define "meshca.rootCertConfigMaps" -}}
{{- if or .Values.istio.enabled .Values.trust.rootCertConfigMaps.enabled }}true{{ end -}}
{{- end -}}
