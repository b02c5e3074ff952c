{{/*
serve's settings, as the command line the chart gives it: one "--flag=value"
(or "--flag") a line, serve first. meshca.serveConfig turns them into a
ServeConfig file when serveConfig.configMap is set.
*/}}
{{- define "meshca.serveArgs" -}}
{{- $ns := .Release.Namespace -}}
{{- $full := include "meshca.fullname" . -}}
- serve
- --trust-domain={{ .Values.ca.trustDomain }}
- --cluster-id={{ .Values.ca.clusterID }}
- --trusted-node-accounts={{ join "," .Values.ca.trustedNodeAccounts }}
{{- /* No node proxy may take istiod's identity, of any revision, in
istio.namespace; meshca denies its own account itself. */}}
{{- $istiodNs := include "meshca.istiodNamespace" . }}
{{- $istiod := list (printf "%s/istiod" $istiodNs) (printf "%s/istiod-*" $istiodNs) }}
- --node-proxy-deny={{ concat (.Values.ca.nodeProxyDeny | default list) $istiod | uniq | join "," }}
- --token-audiences={{ join "," .Values.ca.tokenAudiences }}
- --default-ttl={{ .Values.ca.defaultTTL }}
- --max-ttl={{ .Values.ca.maxTTL }}
{{- $names := .Values.ca.servingDNSNames | default (list (printf "istiod.%s.svc" $ns) (printf "%s.%s.svc" $full $ns)) }}
- --serving-dns-names={{ join "," $names }}
{{- with .Values.ca.keyPolicy }}
- --key-policy={{ . }}
{{- end }}
{{- with include "meshca.stateArg" . }}
- {{ . }}
{{- end }}
{{- if include "meshca.rotatable" . }}
- --auto-rotate={{ .Values.rootRotation.autoRotate }}
- --rotation-margin={{ .Values.rootRotation.margin }}
- --root-lifetime={{ .Values.rootRotation.rootLifetime }}
- --root-key-type={{ .Values.rootRotation.rootKeyType }}
{{- end }}
{{- if include "meshca.crl" . }}
- --crl
- --crl-validity={{ .Values.revocation.crlValidity }}
- --crl-refresh-at={{ .Values.revocation.crlRefreshAt }}
- --crl-propagation={{ .Values.revocation.crlPropagation }}
{{- end }}
{{- with include "meshca.signerArgs" (dict "ctx" . "root" false) | trim }}
{{- . | nindent 0 }}
{{- end }}
{{- with include "meshca.upstreamArgs" . | trim }}
{{- . | nindent 0 }}
{{- end }}
{{- if include "meshca.istiodCert" . }}
{{- $ic := .Values.istio.istiodCertificate }}
- --istiod-cert-secret={{ include "meshca.istiodCertSecret" . }}
{{- with $ic.dnsNames }}
- --istiod-cert-dns-names={{ join "," . }}
{{- end }}
{{- with $ic.revision }}
- --istiod-revision={{ . }}
{{- end }}
- --istiod-cert-ttl={{ $ic.ttl }}
{{- with include "meshca.istiodDeployment" . }}
- --istiod-deployment={{ . }}
{{- end }}
{{- end }}
{{- with .Values.trust.rootCertConfigMaps }}
{{- if include "meshca.rootCertConfigMaps" $ }}
- --publish-root-cert-configmaps
{{- end }}
{{- if include "meshca.crlConfigMaps" $ }}
- --publish-crl
{{- end }}
{{- if or (include "meshca.rootCertConfigMaps" $) (include "meshca.crlConfigMaps" $) }}
{{- with .namespaceSelector }}
- --trust-namespace-selector={{ . }}
{{- end }}
{{- with .skipNamespaces }}
- --trust-skip-namespaces={{ join "," . }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.trust.clusterTrustBundle }}
{{- if .enabled }}
- --publish-cluster-trust-bundle
{{- with include "meshca.clusterTrustBundleSigner" $ }}
- --cluster-trust-bundle-signer-name={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.podCertificates }}
{{- if .signerName }}
- --pod-certificate-signer-name={{ .signerName }}
{{- with .namespaceSelector }}
- --pod-certificate-namespace-selector={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- /* meshca watches $POD_NAMESPACE's remote-cluster Secrets unless told none. */}}
- --remote-secret-namespace={{ with .Values.multiCluster.remoteSecrets }}{{ if .enabled }}{{ .namespace }}{{ end }}{{ end }}
{{- with .Values.monitoring }}
{{- if .bindPodIP }}
- --admin-bind-address=$(POD_IP)
{{- end }}
- --admin-max-connections={{ int .maxConnections }}
- --admin-max-connections-per-peer={{ int .maxConnectionsPerPeer }}
{{- end }}
- --log-format={{ .Values.log.format }}
- --log-level={{ .Values.log.level }}
- --memory-limit=$(MEMORY_LIMIT)
{{- with .Values.connections }}
- --max-connections={{ int .max }}
- --max-connections-per-peer={{ int .maxPerPeer }}
- --max-unauthenticated-connections={{ int .maxUnauthenticated }}
- --max-unauthenticated-connections-per-peer={{ int .maxUnauthenticatedPerPeer }}
- --max-unauthenticated-cooldown={{ .maxUnauthenticatedCooldown }}
- --tls-handshake-timeout={{ .tlsHandshakeTimeout }}
- --max-connection-idle-unauthenticated={{ .maxIdleUnauthenticated }}
- --max-connection-age-unauthenticated={{ .maxAgeUnauthenticated }}
- --request-message-timeout={{ .requestMessageTimeout }}
- --max-unauthenticated-streams={{ int .maxUnauthenticatedStreams }}
- --max-unauthenticated-streams-per-peer={{ int .maxUnauthenticatedStreamsPerPeer }}
{{- end }}
{{- end }}

{{/*
serve's arguments split in two, as YAML {config: {...}, args: [...]}: the
settings a ServeConfig file holds, keyed as meshca reads them
(files/serve-config-keys.yaml, which meshca's tests keep in step with its
flags), and what stays on the command line: serve itself and any value the
kubelet expands, $(VAR), which a file would hold as written.
*/}}
{{- define "meshca.serveSplit" -}}
{{- $keys := .Files.Get "files/serve-config-keys.yaml" | fromYaml -}}
{{- $config := dict -}}
{{- $args := list -}}
{{- range include "meshca.serveArgs" . | fromYamlArray -}}
{{- $kv := regexSplit "=" (trimPrefix "--" .) 2 -}}
{{- $k := get $keys (first $kv) -}}
{{- if or (not (hasPrefix "--" .)) (contains "$(" .) (not $k) -}}
{{- $args = append $args . -}}
{{- else -}}
{{- $v := "true" -}}
{{- if eq (len $kv) 2 -}}{{- $v = last $kv -}}{{- end -}}
{{- if $k.list -}}
{{- if eq $v "" -}}{{- $v = list -}}{{- else -}}{{- $v = splitList "," $v -}}{{- end -}}
{{- else if has $v (list "true" "false") -}}
{{- $v = eq $v "true" -}}
{{- else if regexMatch "^[1-9][0-9]{0,8}$" $v -}}
{{- $v = atoi $v -}}
{{- end -}}
{{- $path := splitList "." $k.key -}}
{{- if eq (len $path) 1 -}}
{{- $_ := set $config $k.key $v -}}
{{- else -}}
{{- $section := get $config (first $path) | default dict -}}
{{- $_ := set $section (last $path) $v -}}
{{- $_ := set $config (first $path) $section -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "config" $config "args" $args | toYaml -}}
{{- end }}

{{/* The ServeConfig file of serveConfig.configMap. */}}
{{- define "meshca.serveConfigFile" -}}
apiVersion: meshca.io/v1alpha1
kind: ServeConfig
{{ (include "meshca.serveSplit" . | fromYaml).config | toYaml }}
{{- end }}

{{/* The container's arguments, extraArgs aside. */}}
{{- define "meshca.containerArgs" -}}
{{- if .Values.serveConfig.configMap -}}
{{- $args := (include "meshca.serveSplit" . | fromYaml).args -}}
{{- append $args "--config=/etc/meshca/config/config.yaml" | toYaml -}}
{{- else -}}
{{ include "meshca.serveArgs" . }}
{{- end }}
{{- end }}
