package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

// TestChartRejectsBadValues: helm refuses each of these values files
// before rendering anything, with a message naming the key: the schema's
// (values.schema.json) for a single key, the templates' fail for rules
// across keys, which JSON schema cannot express.
func TestChartRejectsBadValues(t *testing.T) {
	const schema = "values don't meet the specifications of the schema(s)"
	tests := []struct {
		name, values string
		want         []string
	}{
		{"wrong type", `replicaCount: "2"`,
			[]string{schema, "at '/replicaCount': got string, want integer"}},
		{"list for a string", `ca: {trustDomain: [cluster.local]}`,
			[]string{schema, "at '/ca/trustDomain': got array, want string"}},
		{"unknown top-level key", `replicas: 3`,
			[]string{schema, "additional properties 'replicas' not allowed"}},
		{"misspelt nested key", `trust: {rootCertConfigmaps: {enabled: false}}`,
			[]string{schema, "at '/trust': additional properties 'rootCertConfigmaps' not allowed"}},
		{"the CRL switch as a string", `trust: {crlConfigMaps: {enabled: "yes"}}`,
			[]string{schema, "at '/trust/crlConfigMaps/enabled': got string, want null or boolean"}},
		{"credential in plain text", `signer: {vault: {auth: {token: {value: hvs.secret}}}}`,
			[]string{schema, "at '/signer/vault/auth/token': additional properties 'value' not allowed"}},
		{"network policy peers as one object", `networkPolicy: {enabled: true, grpcFrom: {namespaceSelector: {}}}`,
			[]string{schema, "at '/networkPolicy/grpcFrom': got object, want array"}},
		{"node proxy deny entry that is no namespace", `ca: {nodeProxyDeny: [Kube-System]}`,
			[]string{schema, "at '/ca/nodeProxyDeny/0': 'Kube-System' does not match pattern"}},
		{"node proxy deny entry of three parts", `ca: {nodeProxyDeny: [istio-system/istiod/x]}`,
			[]string{schema, "at '/ca/nodeProxyDeny/0': 'istio-system/istiod/x' does not match pattern"}},
		{"node proxy deny prefix of nothing", `ca: {nodeProxyDeny: ["istio-system/*"]}`,
			[]string{schema, "at '/ca/nodeProxyDeny/0': 'istio-system/*' does not match pattern"}},
		{"node proxy deny star inside a name", `ca: {nodeProxyDeny: ["istio-system/istiod-*-x"]}`,
			[]string{schema, "at '/ca/nodeProxyDeny/0': 'istio-system/istiod-*-x' does not match pattern"}},
		{"node proxy deny as one string", `ca: {nodeProxyDeny: kube-system}`,
			[]string{schema, "at '/ca/nodeProxyDeny': got string, want array"}},
		{"monitoring bound to an address", `monitoring: {bindPodIP: 10.0.0.1}`,
			[]string{schema, "at '/monitoring/bindPodIP': got string, want boolean"}},
		{"monitoring connections negative", `monitoring: {maxConnectionsPerPeer: -1}`,
			[]string{schema, "at '/monitoring/maxConnectionsPerPeer': minimum: got -1, want 0"}},
		{"TTL in days", `ca: {defaultTTL: 1d}`,
			[]string{schema, "at '/ca/defaultTTL': '1d' does not match pattern"}},
		{"TTL that is no duration", `ca: {maxTTL: "90 days"}`,
			[]string{schema, "at '/ca/maxTTL': '90 days' does not match pattern"}},
		{"unknown signer", `signer: {type: awskms}`,
			[]string{schema, "at '/signer/type': value must be one of 'local', 'cfssl', 'vault', 'k8scsr'"}},
		{"k8scsr without a signer name", "signer: {type: k8scsr, servingCertificate: {secretName: s}}",
			[]string{schema, "at '/signer/k8scsr/signerName': minLength: got 0, want 1"}},
		{"k8scsr with a built-in kubernetes.io signer", "signer:\n  type: k8scsr\n  servingCertificate: {secretName: s}\n" +
			"  k8scsr: {signerName: kubernetes.io/kube-apiserver-client}",
			[]string{schema, "at '/signer/k8scsr/signerName': 'not' failed"}},
		{"k8scsr with a kubernetes.io subdomain's signer", "signer: {type: k8scsr, k8scsr: {signerName: beta.kubernetes.io/legacy-unknown}}",
			[]string{schema, "at '/signer/k8scsr/signerName': 'not' failed"}},
		{"k8scsr signer name without a domain", "signer: {type: k8scsr, k8scsr: {signerName: meshca/svid}}",
			[]string{schema, "at '/signer/k8scsr/signerName': 'meshca/svid' does not match pattern"}},
		{"k8scsr kubeconfig in plain text", "signer: {k8scsr: {kubeconfig: {value: 'apiVersion: v1'}}}",
			[]string{schema, "at '/signer/k8scsr/kubeconfig': additional properties 'value' not allowed"}},
		{"directory state with two replicas", `state: {type: directory}`,
			[]string{schema, "at '/replicaCount': maximum: got 2, want 1"}},
		{"directory state with three replicas", "replicaCount: 3\nstate: {type: directory}",
			[]string{schema, "at '/replicaCount': maximum: got 3, want 1"}},
		{"maxTTL below defaultTTL", `ca: {defaultTTL: 48h, maxTTL: 24h}`,
			[]string{"ca.maxTTL (24h) is below ca.defaultTTL (48h)"}},
		{"maxTTL below defaultTTL in mixed units", `ca: {defaultTTL: 1h30m, maxTTL: 5399s}`,
			[]string{"ca.maxTTL (5399s) is below ca.defaultTTL (1h30m)"}},
		{"root outlived by its leaves", `rootRotation: {rootLifetime: 720h}`,
			[]string{"rootRotation.rootLifetime (720h) must be longer than ca.maxTTL (2160h)"}},
		{"CRL reissued after it could expire", `revocation: {enabled: true, crlRefreshAt: 0.9}`,
			[]string{schema, "at '/revocation/crlRefreshAt': maximum: got 0.9, want 0.75"}},
		{"CRLs with an external signer", "revocation: {enabled: true}\nsigner: {type: vault, servingCertificate: {secretName: s}, vault: {addr: https://vault:8200, role: r}}",
			[]string{"revocation.enabled needs the built-in CA on a CA state (signer.type local, state.type secret or directory), not signer.type vault"}},
		{"CRLs with a plugged-in CA", "revocation: {enabled: true}\nstate: {type: cacerts}",
			[]string{"revocation.enabled needs the built-in CA on a CA state", "not signer.type local with state.type cacerts"}},
		{"CRLs published with no CRL made", `trust: {crlConfigMaps: {enabled: true}}`,
			[]string{"trust.crlConfigMaps.enabled publishes CRLs, and signer.type local with revocation.enabled false makes none", "docs/backends.md"}},
		{"CRLs published from cfssl", "trust: {crlConfigMaps: {enabled: true}}\nsigner: {type: cfssl, servingCertificate: {secretName: s}, cfssl: {url: https://c:8888}}",
			[]string{"trust.crlConfigMaps.enabled publishes CRLs, and signer.type cfssl with revocation.enabled false makes none"}},
		{"unknown upstream", `upstream: {type: kms}`,
			[]string{schema, "at '/upstream/type': value must be one of"}},
		{"upstream with another signer", "upstream: {type: self}\nsigner: {type: vault}",
			[]string{schema, "at '/signer/type': value must be 'local'"}},
		{"upstream with a plugged-in CA", "upstream: {type: self}\nstate: {type: cacerts}",
			[]string{schema, "at '/state/type': value must be one of 'secret', 'directory'"}},
		{"upstream renewed at its end", `upstream: {type: self, renewAt: 1}`,
			[]string{schema, "at '/upstream/renewAt': exclusiveMaximum"}},
		{"upstream intermediate of seconds", `upstream: {type: self, intermediateTTL: 30s}`,
			[]string{"upstream.intermediateTTL (30s) must be at least 1m"}},
		{"vault upstream without an address", `upstream: {type: vault-pki}`,
			[]string{schema, "at '/upstream/vault/addr': minLength: got 0, want 1"}},
		{"vault upstream without a Kubernetes role", `upstream: {type: vault-transit, vault: {addr: "https://vault:8200"}}`,
			[]string{schema, "at '/upstream/vault/auth/kubernetes/role': minLength: got 0, want 1"}},
		{"vault upstream without its token", `upstream: {type: vault-pki, vault: {addr: "https://vault:8200", auth: {method: token}}}`,
			[]string{schema, "at '/upstream/vault/auth/token/secretName': minLength: got 0, want 1"}},
		{"vault upstream without an AppRole secret id", `upstream: {type: vault-pki, vault: {addr: "https://vault:8200", auth: {method: approle, approle: {roleID: r}}}}`,
			[]string{schema, "at '/upstream/vault/auth/approle/secretID/secretName': minLength: got 0, want 1"}},
		{"Transit key with a version", "upstream: {type: vault-transit, vaultTransit: {key: \"root:2\"}, vault: {addr: \"https://vault:8200\", auth: {kubernetes: {role: m}}}}",
			[]string{schema, "at '/upstream/vaultTransit/key'"}},
		{"vault upstream with the vault signer", "upstream: {type: vault-pki, vault: {addr: \"https://vault:8200\", auth: {kubernetes: {role: m}}}}\nsigner: {type: vault}",
			[]string{schema, "at '/signer/type': value must be 'local'"}},
		{"upstream intermediate renewed too late for a day's leaves", `upstream: {type: self, intermediateTTL: 2m}`,
			[]string{"upstream.intermediateTTL (2m) × upstream.renewAt (0.5) must leave at least twice a leaf worth issuing"}},
		{"pkcs11 without a module", `upstream: {type: pkcs11, pkcs11: {tokenLabel: t, pinSecret: {name: pin}}}`,
			[]string{schema, "at '/upstream/pkcs11/module': minLength: got 0, want 1"}},
		{"pkcs11 module by a relative path", `upstream: {type: pkcs11, pkcs11: {module: lib.so, tokenLabel: t, pinSecret: {name: pin}}}`,
			[]string{schema, "at '/upstream/pkcs11/module': 'lib.so' does not match pattern"}},
		{"pkcs11 without a PIN", `upstream: {type: pkcs11, pkcs11: {module: /hsm.so, tokenLabel: t}}`,
			[]string{schema, "at '/upstream/pkcs11/pinSecret/name': minLength: got 0, want 1"}},
		{"pkcs11 PIN in plain text", `upstream: {type: pkcs11, pkcs11: {module: /hsm.so, tokenLabel: t, pin: "1234"}}`,
			[]string{schema, "at '/upstream/pkcs11': additional properties 'pin' not allowed"}},
		{"pkcs11 without a token", `upstream: {type: pkcs11, pkcs11: {module: /hsm.so, pinSecret: {name: pin}}}`,
			[]string{schema, "at '/upstream/pkcs11': 'oneOf' failed, none matched", "at '/upstream/pkcs11/tokenLabel': minLength: got 0, want 1"}},
		{"pkcs11 token by label and slot", `upstream: {type: pkcs11, pkcs11: {module: /hsm.so, tokenLabel: t, slot: 0, pinSecret: {name: pin}}}`,
			[]string{schema, "at '/upstream/pkcs11': 'oneOf' failed, none matched", "at '/upstream/pkcs11/slot': value must be -1"}},
		{"vault without a serving certificate", `signer: {type: vault}`,
			[]string{"signer.servingCertificate.secretName is required with signer.type vault"}},
		{"vault without an address", `signer: {type: vault, servingCertificate: {secretName: s}}`,
			[]string{"signer.vault.addr is required with signer.type vault"}},
		{"vault AppRole without its secret id", "signer:\n  type: vault\n  servingCertificate: {secretName: s}\n" +
			"  vault: {addr: https://v:8200, role: r, auth: {method: approle, approle: {roleID: x}}}",
			[]string{"signer.vault.auth.approle.roleID and signer.vault.auth.approle.secretID.secretName are required"}},
		{"k8scsr without a serving certificate", "signer: {type: k8scsr, k8scsr: {signerName: example.com/meshca}}",
			[]string{"signer.servingCertificate.secretName is required with signer.type k8scsr"}},
		{"k8scsr without trust anchors", "signer: {type: k8scsr, servingCertificate: {secretName: s}, k8scsr: {signerName: example.com/meshca}}\nstate: {type: none}",
			[]string{"signer.trustAnchors.secretName is required with signer.type k8scsr and state.type none"}},
		{"cfssl without trust anchors", "signer: {type: cfssl, servingCertificate: {secretName: s}, cfssl: {url: https://c:8888}}\nstate: {type: none}",
			[]string{"signer.trustAnchors.secretName is required with signer.type cfssl and state.type none"}},
		{"plugged-in CA with vault", "signer: {type: vault}\nstate: {type: cacerts}",
			[]string{"state.type cacerts is a plugged-in CA for the local signer, not signer.type vault"}},
		{"local signer without a state", `state: {type: none}`,
			[]string{"state.type none needs an external signer"}},
		{"remote secrets as a switch", `multiCluster: {remoteSecrets: true}`,
			[]string{schema, "at '/multiCluster/remoteSecrets': got boolean, want object"}},
		{"remote secrets in no namespace", `multiCluster: {remoteSecrets: {enabled: true, namespace: ""}}`,
			[]string{schema, "at '/multiCluster/remoteSecrets/namespace'"}},
		{"remote secrets in the release namespace", `multiCluster: {remoteSecrets: {enabled: true, namespace: istio-system}}`,
			[]string{"multiCluster.remoteSecrets.namespace (istio-system) is meshca's or istiod's namespace", "meshca could read every Secret there"}},
		{"remote secrets in istiod's namespace", "istio: {namespace: mesh-control}\nmultiCluster: {remoteSecrets: {enabled: true, namespace: mesh-control}}",
			[]string{"multiCluster.remoteSecrets.namespace (mesh-control) is meshca's or istiod's namespace"}},
		{"ClusterTrustBundle of another signer than the pod certificates'", "podCertificates: {signerName: meshca.io/svid}\n" +
			"trust: {clusterTrustBundle: {enabled: true, signerName: meshca.io/other}}",
			[]string{"trust.clusterTrustBundle.signerName (meshca.io/other) must be empty or podCertificates.signerName (meshca.io/svid)"}},
		{"budget that keeps every replica", "replicaCount: 1\npodDisruptionBudget: {minAvailable: 2}",
			[]string{"podDisruptionBudget.minAvailable (2) is not below replicaCount (1): the budget can never be satisfied"}},
		{"budget that keeps every replica as a percentage", `podDisruptionBudget: {minAvailable: "60%"}`,
			[]string{"podDisruptionBudget.minAvailable (60%, 2 Pods rounded up) is not below replicaCount (2)"}},
		{"budget that allows no eviction", `podDisruptionBudget: {maxUnavailable: 0}`,
			[]string{"podDisruptionBudget.maxUnavailable (0) allows no eviction of replicaCount's 2 Pods"}},
		{"memory that is no quantity", `resources: {limits: {memory: 256MB}}`,
			[]string{schema, "at '/resources/limits/memory': '256MB' does not match pattern"}},
		{"rotation Job memory that is no quantity", `rootRotation: {cronJob: {resources: {requests: {memory: 32 Mi}}}}`,
			[]string{schema, "at '/rootRotation/cronJob/resources/requests/memory': '32 Mi' does not match pattern"}},
		{"common label the chart sets itself", `commonLabels: {app.kubernetes.io/name: other}`,
			[]string{"commonLabels sets app.kubernetes.io/name, a label the chart sets itself"}},
		{"common label that is no label", `commonLabels: {"team name": mesh}`,
			[]string{schema, "at '/commonLabels': additional properties 'team name' not allowed"}},
		{"pod label also a common label", "commonLabels: {tier: a}\npodLabels: {tier: b}",
			[]string{"podLabels and commonLabels both set tier"}},
		{"extra env var the chart sets itself", `extraEnv: [{name: MEMORY_LIMIT, value: "1Gi"}]`,
			[]string{"extraEnv sets MEMORY_LIMIT, which the chart sets itself"}},
		{"extra env var without a name", `extraEnv: [{value: http://proxy:3128}]`,
			[]string{schema, "at '/extraEnv/0': missing property 'name'"}},
		{"extra volume mount without a path", `extraVolumeMounts: [{name: proxy-ca}]`,
			[]string{schema, "at '/extraVolumeMounts/0': missing property 'mountPath'"}},
		{"istiod's certificate in Istio's cacerts", `istio: {enabled: true, istiodCertificate: {secretName: cacerts}}`,
			[]string{schema, "at '/istio/istiodCertificate/secretName': 'allOf' failed", "'not' failed"}},
		{"istiod's certificate in istiod's own CA Secret", `istio: {istiodCertificate: {secretName: istio-ca-secret}}`,
			[]string{schema, "at '/istio/istiodCertificate/secretName': 'allOf' failed"}},
		{"istiod's certificate in the CA state's Secret", `istio: {enabled: true, istiodCertificate: {secretName: meshca-ca-state}}`,
			[]string{"istio.istiodCertificate.secretName (meshca-ca-state) is the CA state's Secret (state.secret.name) in istio-system: it holds the CA's keys"}},
		{"istiod's certificate in a named CA state's Secret", "state: {secret: {name: ca-keys}}\nistio: {enabled: true, istiodCertificate: {secretName: ca-keys}}",
			[]string{"istio.istiodCertificate.secretName (ca-keys) is the CA state's Secret (state.secret.name)"}},
		{"istiod's certificate in the plugged-in CA's Secret", "state: {type: cacerts, cacerts: {secretName: plugged}}\nistio: {enabled: true, istiodCertificate: {secretName: plugged}}",
			[]string{"istio.istiodCertificate.secretName (plugged) is the plugged-in CA's Secret (state.cacerts.secretName)"}},
		{"extra object of two manifests", "extraObjects:\n- |\n  apiVersion: v1\n  kind: ConfigMap\n  ---\n  apiVersion: v1\n  kind: Secret",
			[]string{"extraObjects[0] holds more than one manifest"}},
		{"extra object that is no manifest", `extraObjects: ["name: {{ .Release.Name }}"]`,
			[]string{"extraObjects[0] has no apiVersion or kind once rendered"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(tt.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := harness.HelmTemplate(helm, "meshca", "istio-system", "--values", file)
			if err == nil {
				t.Fatalf("rendered %d bytes, want a refusal", len(out))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal does not say %q:\n%v", w, err)
				}
			}
		})
	}
}
