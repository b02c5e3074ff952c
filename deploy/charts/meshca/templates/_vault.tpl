{{/*
How meshca reaches Vault and logs in, for the Vault signer (signer.vault)
and the Vault upstreams (upstream.vault) alike: each is called with that
dict (addr, tlsCA, auth). The same flags (--vault-addr, the login) serve
both, and only one of them is in use at a time.
*/}}

{{- define "meshca.vaultLoginArgs" }}
- --vault-addr={{ .addr }}
{{- if .tlsCA.secretName }}
- --vault-ca-file=/etc/meshca/vault-tls-ca/{{ .tlsCA.key }}
{{- end }}
{{- $a := .auth }}
{{- if eq $a.method "kubernetes" }}
- --vault-kubernetes-role={{ $a.kubernetes.role }}
{{- with $a.kubernetes.mount }}
- --vault-kubernetes-mount={{ . }}
{{- end }}
{{- if $a.kubernetes.audience }}
- --vault-kubernetes-token-file=/var/run/secrets/vault/token
{{- end }}
{{- else if eq $a.method "token" }}
- --vault-token-file=/etc/meshca/vault-token/{{ $a.token.key }}
{{- else if eq $a.method "approle" }}
- --vault-approle-role-id={{ $a.approle.roleID }}
- --vault-approle-secret-id-file=/etc/meshca/vault-approle/{{ $a.approle.secretID.key }}
{{- with $a.approle.mount }}
- --vault-approle-mount={{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* meshca.vaultLoginSecrets: name → Secret of the Secrets the login reads, as JSON. */}}
{{- define "meshca.vaultLoginSecrets" -}}
{{- $m := dict -}}
{{- $a := .auth -}}
{{- if .tlsCA.secretName -}}{{- $_ := set $m "vault-tls-ca" .tlsCA.secretName -}}{{- end -}}
{{- if eq $a.method "token" -}}{{- $_ := set $m "vault-token" $a.token.secretName -}}{{- end -}}
{{- if eq $a.method "approle" -}}{{- $_ := set $m "vault-approle" $a.approle.secretID.secretName -}}{{- end -}}
{{- toJson $m -}}
{{- end -}}

{{/* The service-account token projected for the Kubernetes login's audience. */}}
{{- define "meshca.vaultTokenVolume" -}}
{{- if and (eq .auth.method "kubernetes") .auth.kubernetes.audience }}
- name: vault-sa-token
  projected:
    sources:
    - serviceAccountToken:
        audience: {{ .auth.kubernetes.audience }}
        expirationSeconds: 3600
        path: token
{{- end }}
{{- end -}}

{{- define "meshca.vaultTokenMount" -}}
{{- if and (eq .auth.method "kubernetes") .auth.kubernetes.audience }}
- name: vault-sa-token
  mountPath: /var/run/secrets/vault
  readOnly: true
{{- end }}
{{- end -}}
