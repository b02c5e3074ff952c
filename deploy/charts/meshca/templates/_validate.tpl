{{/*
meshca.validate fails the render on values the schema cannot judge: rules
across two keys. Each message names the keys and what to do.
*/}}
{{- define "meshca.validate" -}}
{{- $v := .Values -}}
{{- $default := include "meshca.seconds" $v.ca.defaultTTL | float64 -}}
{{- $max := include "meshca.seconds" $v.ca.maxTTL | float64 -}}
{{- $life := include "meshca.seconds" $v.rootRotation.rootLifetime | float64 -}}
{{- if lt $max $default -}}
{{- fail (printf "ca.maxTTL (%s) is below ca.defaultTTL (%s): the longest lifetime a client may ask for must be at least the default" $v.ca.maxTTL $v.ca.defaultTTL) -}}
{{- end -}}
{{- if le $life $max -}}
{{- fail (printf "rootRotation.rootLifetime (%s) must be longer than ca.maxTTL (%s): a root outlives every leaf it signs" $v.rootRotation.rootLifetime $v.ca.maxTTL) -}}
{{- end -}}
{{- $pcs := $v.podCertificates.signerName -}}
{{- $ctb := $v.trust.clusterTrustBundle.signerName -}}
{{- if and $pcs $ctb (ne $pcs $ctb) -}}
{{- fail (printf "trust.clusterTrustBundle.signerName (%s) must be empty or podCertificates.signerName (%s): the Pods mount the ClusterTrustBundle of their signer" $ctb $pcs) -}}
{{- end -}}
{{- $s := $v.signer -}}
{{- if eq $s.type "local" -}}
{{- if eq $v.state.type "none" -}}
{{- fail "state.type none needs an external signer (signer.type cfssl, vault or k8scsr): the local signer keeps its key in the CA state" -}}
{{- end -}}
{{- else -}}
{{- if eq $v.state.type "cacerts" -}}
{{- fail (printf "state.type cacerts is a plugged-in CA for the local signer, not signer.type %s: use secret, directory or none" $s.type) -}}
{{- end -}}
{{- if and (eq $v.state.type "none") (not $s.trustAnchors.secretName) -}}
{{- fail (printf "signer.trustAnchors.secretName is required with signer.type %s and state.type none: the trust bundle is pinned, never learned from the backend" $s.type) -}}
{{- end -}}
{{- if and (ne $v.state.type "none") $s.trustAnchors.secretName -}}
{{- fail (printf "signer.trustAnchors.secretName goes with state.type none, not %s: the CA state holds the trust bundle" $v.state.type) -}}
{{- end -}}
{{- if not $s.servingCertificate.secretName -}}
{{- fail (printf "signer.servingCertificate.secretName is required with signer.type %s: meshca holds no CA key to issue its own serving certificate" $s.type) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $s.type "cfssl") (not $s.cfssl.url) -}}
{{- fail "signer.cfssl.url is required with signer.type cfssl (the chart runs a remote cfssl only)" -}}
{{- end -}}
{{- if eq $s.type "vault" -}}
{{- include "meshca.validateVault" $s.vault -}}
{{- end -}}
{{- if $v.istio.enabled -}}
{{- if eq $s.type "k8scsr" -}}
{{- fail "istio.enabled needs signer.type local, cfssl or vault: a CertificateSigningRequest's signer cannot tell istiod's DNS certificate from a workload's" -}}
{{- end -}}
{{- if and (eq $s.type "vault") (not $s.vault.istiodRole) -}}
{{- fail "signer.vault.istiodRole is required with istio.enabled: istiod's DNS certificate needs a Vault role of its own (docs/signers/vault.md)" -}}
{{- end -}}
{{- if and (eq $s.type "cfssl") (not $s.cfssl.istiodProfile) -}}
{{- fail "signer.cfssl.istiodProfile is required with istio.enabled: istiod's DNS certificate needs a cfssl profile of its own (docs/signers/cfssl.md)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "meshca.validateVault" -}}
{{- if not .addr -}}
{{- fail "signer.vault.addr is required with signer.type vault" -}}
{{- end -}}
{{- if not .role -}}
{{- fail "signer.vault.role is required with signer.type vault" -}}
{{- end -}}
{{- if and .istiodRole (or (eq .istiodRole .role) (eq .istiodRole .rsaRole)) -}}
{{- fail "signer.vault.istiodRole names a workload role: istiod's DNS certificate needs a role of its own" -}}
{{- end -}}
{{- if and .rsaRole (eq .rsaRole .role) -}}
{{- fail "signer.vault.rsaRole names the same role as signer.vault.role: RSA keys need key encipherment that other keys must not have" -}}
{{- end -}}
{{- $a := .auth -}}
{{- if and (eq $a.method "kubernetes") (not $a.kubernetes.role) -}}
{{- fail "signer.vault.auth.kubernetes.role is required with signer.vault.auth.method kubernetes" -}}
{{- end -}}
{{- if and (eq $a.method "token") (not $a.token.secretName) -}}
{{- fail "signer.vault.auth.token.secretName is required with signer.vault.auth.method token" -}}
{{- end -}}
{{- if and (eq $a.method "approle") (not (and $a.approle.roleID $a.approle.secretID.secretName)) -}}
{{- fail "signer.vault.auth.approle.roleID and signer.vault.auth.approle.secretID.secretName are required with signer.vault.auth.method approle" -}}
{{- end -}}
{{- end -}}
