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
{{- if and $v.revocation.enabled (not (include "meshca.crl" .)) -}}
{{- fail (printf "revocation.enabled needs the built-in CA on a CA state (signer.type local, state.type secret or directory), not signer.type %s with state.type %s: meshca signs the CRLs of its own authorities (docs/backends.md)" $v.signer.type $v.state.type) -}}
{{- end -}}
{{- if and (eq (toString $v.trust.crlConfigMaps.enabled) "true") (not (include "meshca.crlSource" .)) -}}
{{- fail (printf "trust.crlConfigMaps.enabled publishes CRLs, and signer.type %s with revocation.enabled false makes none: set revocation.enabled (the built-in CA on a CA state signs them), or use signer.type vault (Vault's CRLs are published); cfssl and k8scsr keep no CRL meshca can publish (docs/backends.md)" $v.signer.type) -}}
{{- end -}}
{{- if and $v.rootRotation.cronJob.steps.retire.destroyRootKey (not $v.upstream.type) -}}
{{- fail "rootRotation.cronJob.steps.retire.destroyRootKey destroys a retired root's key where upstream.type keeps it: set upstream.type, or leave it false (retire destroys a key the CA state keeps by itself)" -}}
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
{{- include "meshca.validateIstiodSecret" . -}}
{{- if and (include "meshca.istiodDeployment" .) (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "istio.istiodDeployment.restart needs Kubernetes 1.30 or later (this is %s): its ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) keeps meshca's patch of istiod's Deployment to the restart annotation; set it false and restart istiod yourself after a rotation's prepare" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{- with $v.upstream -}}
{{- $ttl := include "meshca.seconds" .intermediateTTL | float64 -}}
{{- if and .type (lt $ttl 60.0) -}}
{{- fail (printf "upstream.intermediateTTL (%s) must be at least 1m" .intermediateTTL) -}}
{{- end -}}
{{- if and .type (lt (mulf $ttl .renewAt) (mulf 2.0 (minf 60.0 (divf $default 2.0)))) -}}
{{- fail (printf "upstream.intermediateTTL (%s) × upstream.renewAt (%v) must leave at least twice a leaf worth issuing (half of ca.defaultTTL, at most a minute) at a renewal" .intermediateTTL .renewAt) -}}
{{- end -}}
{{- end -}}
{{- include "meshca.validateBudget" . -}}
{{- include "meshca.validateExtras" . -}}
{{- end -}}

{{/*
A PodDisruptionBudget that allows no eviction ever: every node drain would
wait on meshca. Percentages round up, as the disruption controller does.
*/}}
{{- define "meshca.validateBudget" -}}
{{- $p := .Values.podDisruptionBudget -}}
{{- $n := int .Values.replicaCount -}}
{{- if and $p.enabled (gt $n 0) -}}
{{- if hasKey $p "minAvailable" -}}
{{- $min := include "meshca.budgetPods" (dict "v" $p.minAvailable "n" $n) | int -}}
{{- if ge $min $n -}}
{{- $what := ternary (printf "%v, %d Pods rounded up" $p.minAvailable $min) (printf "%v" $p.minAvailable) (kindIs "string" $p.minAvailable) -}}
{{- fail (printf "podDisruptionBudget.minAvailable (%s) is not below replicaCount (%d): the budget can never be satisfied, no meshca Pod may ever be evicted and every node drain waits on it; set minAvailable below replicaCount, or use maxUnavailable" $what $n) -}}
{{- end -}}
{{- else if eq (include "meshca.budgetPods" (dict "v" $p.maxUnavailable "n" $n) | int) 0 -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable (%v) allows no eviction of replicaCount's %d Pods: the budget can never be satisfied and every node drain waits; use at least 1" $p.maxUnavailable $n) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An intOrPercent of (dict "v" value "n" replicas) in Pods, rounded up. */}}
{{- define "meshca.budgetPods" -}}
{{- if kindIs "string" .v -}}
{{- div (add (mul (trimSuffix "%" .v | int) .n) 99) 100 -}}
{{- else -}}
{{- int .v -}}
{{- end -}}
{{- end -}}

{{/*
The labels and environment variables the chart sets itself, which
commonLabels, podLabels and extraEnv may not set again: a selector would
stop matching, or meshca would read another value.
*/}}
{{- define "meshca.validateExtras" -}}
{{- $v := .Values -}}
{{- $own := list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/part-of" "app.kubernetes.io/managed-by" "app.kubernetes.io/component" -}}
{{- range $key := list "commonLabels" "podLabels" -}}
{{- range $k, $_ := get $v $key -}}
{{- if has $k $own -}}
{{- fail (printf "%s sets %s, a label the chart sets itself (its selectors and Helm's ownership rely on it): use another key" $key $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $k, $_ := $v.podLabels -}}
{{- if hasKey ($v.commonLabels | default dict) $k -}}
{{- fail (printf "podLabels and commonLabels both set %s: set it in one" $k) -}}
{{- end -}}
{{- end -}}
{{- range $v.extraEnv -}}
{{- if has .name (list "POD_NAMESPACE" "POD_IP" "MEMORY_LIMIT") -}}
{{- fail (printf "extraEnv sets %s, which the chart sets itself for meshca: use another name" .name) -}}
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

{{/*
istiod's certificate Secret is never a Secret holding a CA's key: the CA
state's (state.type secret) or the plugged-in CA's (state.type cacerts),
when it is in the same namespace. The schema refuses Istio's names.
*/}}
{{- define "meshca.validateIstiodSecret" -}}
{{- $ic := .Values.istio.istiodCertificate.secretName -}}
{{- if eq (include "meshca.istiodNamespace" .) .Release.Namespace -}}
{{- if and (eq .Values.state.type "secret") (eq $ic (include "meshca.stateSecretName" .)) -}}
{{- fail (printf "istio.istiodCertificate.secretName (%s) is the CA state's Secret (state.secret.name) in %s: it holds the CA's keys, not istiod's serving certificate; name another Secret (istiod-tls)" $ic .Release.Namespace) -}}
{{- end -}}
{{- if and (eq .Values.state.type "cacerts") (eq $ic .Values.state.cacerts.secretName) -}}
{{- fail (printf "istio.istiodCertificate.secretName (%s) is the plugged-in CA's Secret (state.cacerts.secretName) in %s: it holds a CA's key, not istiod's serving certificate; name another Secret (istiod-tls)" $ic .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
