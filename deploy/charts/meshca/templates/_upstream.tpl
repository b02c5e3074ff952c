{{/*
The upstream of the signing intermediate (upstream.type): its flags, and
the Secrets its credentials are read from as files. Each upstream adds its
own flags below, under its type, and its Secrets to meshca.upstreamSecrets
(name → Secret, mounted at /etc/meshca/<name>).
*/}}

{{- define "meshca.upstreamArgs" -}}
{{- $u := .Values.upstream -}}
{{- if $u.type }}
- --upstream={{ $u.type }}
- --intermediate-ttl={{ $u.intermediateTTL }}
- --intermediate-renew-at={{ $u.renewAt }}
{{- end }}
{{- include "meshca.upstreamSettingArgs" . }}
{{- end -}}

{{/*
meshca.upstreamRootArgs: --upstream and the upstream's own settings,
without the intermediate's: what `meshca root retire --destroy-root-key`
takes to reach the retired root's key.
*/}}
{{- define "meshca.upstreamRootArgs" -}}
{{- if .Values.upstream.type }}
- --upstream={{ .Values.upstream.type }}
{{- end }}
{{- include "meshca.upstreamSettingArgs" . }}
{{- end -}}

{{/* meshca.upstreamSettingArgs: the flags of upstream.type's own settings. */}}
{{- define "meshca.upstreamSettingArgs" -}}
{{- $u := .Values.upstream -}}
{{- if eq $u.type "vault-pki" }}
{{- include "meshca.vaultLoginArgs" $u.vault }}
- --vault-pki-mount={{ $u.vaultPKI.mount }}
{{- with $u.vaultPKI.issuer }}
- --vault-pki-issuer={{ . }}
{{- end }}
{{- else if eq $u.type "vault-transit" }}
{{- include "meshca.vaultLoginArgs" $u.vault }}
- --vault-transit-mount={{ $u.vaultTransit.mount }}
{{- with $u.vaultTransit.key }}
- --vault-transit-key={{ . }}
{{- end }}
{{- else if eq $u.type "pkcs11" }}
{{- $p := $u.pkcs11 }}
- --pkcs11-module={{ $p.module }}
{{- if $p.tokenLabel }}
- --pkcs11-token-label={{ $p.tokenLabel }}
{{- else }}
- --pkcs11-slot={{ $p.slot }}
{{- end }}
- --pkcs11-pin-file=/etc/meshca/pkcs11-pin/{{ $p.pinSecret.key }}
{{- end }}
{{- end -}}

{{/* meshca.vaultUpstream: "true" when upstream.type is a Vault upstream. */}}
{{- define "meshca.vaultUpstream" -}}
{{- if has .Values.upstream.type (list "vault-pki" "vault-transit") }}true{{ end -}}
{{- end -}}

{{/* meshca.upstreamSecrets: name → Secret of every Secret the upstream reads. */}}
{{- define "meshca.upstreamSecrets" -}}
{{- $m := dict -}}
{{- if include "meshca.vaultUpstream" . -}}
{{- $m = merge $m (include "meshca.vaultLoginSecrets" .Values.upstream.vault | fromJson) -}}
{{- else if eq .Values.upstream.type "pkcs11" -}}
{{- $_ := set $m "pkcs11-pin" .Values.upstream.pkcs11.pinSecret.name -}}
{{- end -}}
{{- toJson $m -}}
{{- end -}}

{{- define "meshca.upstreamVolumes" -}}
{{- range $name, $secret := include "meshca.upstreamSecrets" . | fromJson }}
- name: {{ $name }}
  secret:
    secretName: {{ $secret }}
    defaultMode: 288 # 0440: readable by the Pod's fsGroup
{{- end }}
{{- if include "meshca.vaultUpstream" . }}
{{- include "meshca.vaultTokenVolume" .Values.upstream.vault }}
{{- end }}
{{- end -}}

{{- define "meshca.upstreamMounts" -}}
{{- range $name, $secret := include "meshca.upstreamSecrets" . | fromJson }}
- name: {{ $name }}
  mountPath: /etc/meshca/{{ $name }}
  readOnly: true
{{- end }}
{{- if include "meshca.vaultUpstream" . }}
{{- include "meshca.vaultTokenMount" .Values.upstream.vault }}
{{- end }}
{{- end -}}
