{{/*
The signing backend: its flags, and the Secrets they read as files. Called
with (dict "ctx" $ "root" true|false): `meshca root` takes the backend's
address, login and TLS flags, `meshca serve` all of them. `meshca root`
has no k8scsr side: its steps are then the CA state's alone (its default
--signer local), the signing key being the controller's operator's.
*/}}

{{- define "meshca.signerArgs" -}}
{{- $s := .ctx.Values.signer -}}
{{- if and (ne $s.type "local") (not (and .root (eq $s.type "k8scsr"))) }}
- --signer={{ $s.type }}
{{- end }}
{{- if not .root }}
{{- if $s.trustAnchors.secretName }}
- --trust-anchors=/etc/meshca/trust-anchors/{{ $s.trustAnchors.key }}
{{- end }}
{{- if $s.servingCertificate.secretName }}
- --serving-cert-file=/etc/meshca/serving/tls.crt
- --serving-key-file=/etc/meshca/serving/tls.key
{{- end }}
{{- end }}
{{- if eq $s.type "cfssl" }}
{{- $c := $s.cfssl }}
- --cfssl-url={{ $c.url }}
{{- with $c.profile }}
- --cfssl-profile={{ . }}
{{- end }}
{{- with $c.label }}
- --cfssl-label={{ . }}
{{- end }}
{{- if $c.tlsCA.secretName }}
- --cfssl-tls-ca-file=/etc/meshca/cfssl-tls-ca/{{ $c.tlsCA.key }}
{{- end }}
{{- if not .root }}
{{- with $c.keyEnciphermentProfile }}
- --cfssl-key-encipherment-profile={{ . }}
{{- end }}
{{- if include "meshca.istiodCert" .ctx }}
- --cfssl-istiod-profile={{ $c.istiodProfile }}
{{- end }}
{{- if $c.authKey.secretName }}
- --cfssl-auth-key-file=/etc/meshca/cfssl-auth/{{ $c.authKey.key }}
{{- end }}
{{- end }}
{{- else if eq $s.type "vault" }}
{{- $vt := $s.vault }}
- --vault-pki-mount={{ $vt.pkiMount }}
- --vault-role={{ $vt.role }}
{{- with $vt.rsaRole }}
- --vault-rsa-role={{ . }}
{{- end }}
{{- if and (not .root) (include "meshca.istiodCert" .ctx) }}
- --vault-istiod-role={{ $vt.istiodRole }}
{{- end }}
{{- include "meshca.vaultLoginArgs" $vt }}
{{- else if and (eq $s.type "k8scsr") (not .root) }}
- --k8scsr-signer-name={{ $s.k8scsr.signerName }}
{{- if $s.k8scsr.kubeconfig.secretName }}
- --k8scsr-kubeconfig=/etc/meshca/k8scsr-kubeconfig/{{ $s.k8scsr.kubeconfig.key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* meshca.signerSecrets: name → {secret, mount} of every Secret the backend reads. */}}
{{- define "meshca.signerSecrets" -}}
{{- $s := .ctx.Values.signer -}}
{{- $m := dict -}}
{{- if not .root -}}
{{- if $s.trustAnchors.secretName -}}{{- $_ := set $m "trust-anchors" $s.trustAnchors.secretName -}}{{- end -}}
{{- if $s.servingCertificate.secretName -}}{{- $_ := set $m "serving" $s.servingCertificate.secretName -}}{{- end -}}
{{- end -}}
{{- if eq $s.type "cfssl" -}}
{{- if $s.cfssl.tlsCA.secretName -}}{{- $_ := set $m "cfssl-tls-ca" $s.cfssl.tlsCA.secretName -}}{{- end -}}
{{- if and (not .root) $s.cfssl.authKey.secretName -}}{{- $_ := set $m "cfssl-auth" $s.cfssl.authKey.secretName -}}{{- end -}}
{{- else if eq $s.type "vault" -}}
{{- $m = merge $m (include "meshca.vaultLoginSecrets" $s.vault | fromJson) -}}
{{- else if eq $s.type "k8scsr" -}}
{{- if and (not .root) $s.k8scsr.kubeconfig.secretName -}}{{- $_ := set $m "k8scsr-kubeconfig" $s.k8scsr.kubeconfig.secretName -}}{{- end -}}
{{- end -}}
{{- toJson $m -}}
{{- end -}}

{{- define "meshca.signerVolumes" -}}
{{- range $name, $secret := include "meshca.signerSecrets" . | fromJson }}
- name: {{ $name }}
  secret:
    secretName: {{ $secret }}
    defaultMode: 288 # 0440: readable by the Pod's fsGroup
{{- end }}
{{- if eq .ctx.Values.signer.type "vault" }}
{{- include "meshca.vaultTokenVolume" .ctx.Values.signer.vault }}
{{- end }}
{{- end -}}

{{- define "meshca.signerMounts" -}}
{{- range $name, $secret := include "meshca.signerSecrets" . | fromJson }}
- name: {{ $name }}
  mountPath: /etc/meshca/{{ $name }}
  readOnly: true
{{- end }}
{{- if eq .ctx.Values.signer.type "vault" }}
{{- include "meshca.vaultTokenMount" .ctx.Values.signer.vault }}
{{- end }}
{{- end -}}
