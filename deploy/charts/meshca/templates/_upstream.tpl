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
{{- end -}}

{{/* meshca.upstreamSecrets: name → Secret of every Secret the upstream reads. */}}
{{- define "meshca.upstreamSecrets" -}}
{{- $m := dict -}}
{{- toJson $m -}}
{{- end -}}

{{- define "meshca.upstreamVolumes" -}}
{{- range $name, $secret := include "meshca.upstreamSecrets" . | fromJson }}
- name: {{ $name }}
  secret:
    secretName: {{ $secret }}
    defaultMode: 288 # 0440: readable by the Pod's fsGroup
{{- end }}
{{- end -}}

{{- define "meshca.upstreamMounts" -}}
{{- range $name, $secret := include "meshca.upstreamSecrets" . | fromJson }}
- name: {{ $name }}
  mountPath: /etc/meshca/{{ $name }}
  readOnly: true
{{- end }}
{{- end -}}
