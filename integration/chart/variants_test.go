package chart

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartVariants renders the choices no scenario file makes (the other
// CA states and Vault logins, the trust publishers switched over, k8scsr
// against another cluster), checks what each changes, and dry-runs the
// result.
func TestChartVariants(t *testing.T) {
	ns := cluster.Namespace(t, "chart-variants")
	const vault = "signer:\n  type: vault\n  servingCertificate: {secretName: serving}\n  vault:\n    addr: https://vault:8200\n    role: spiffe\n"
	tests := []struct {
		name, values string
		check        func(*testing.T, []*unstructured.Unstructured)
	}{
		{"directory state", "replicaCount: 1\nstate: {type: directory}", func(t *testing.T, objs []*unstructured.Unstructured) {
			d := deployment(t, objs)
			wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--state-dir=/var/lib/meshca", "--auto-rotate=true"}, []string{"--state-secret"})
			if d.Spec.Strategy.Type != "Recreate" {
				t.Errorf("strategy %s: two Pods must never share the state volume", d.Spec.Strategy.Type)
			}
			wantClaim(t, "Deployment", d.Spec.Template.Spec.Volumes)
			wantClaim(t, "CronJob", cronJob(t, objs, "activate").Spec.JobTemplate.Spec.Template.Spec.Volumes)
			if k := kinds(objs); k["PersistentVolumeClaim"] != 1 || k["Secret"] != 0 || k["Role"] != 0 {
				t.Errorf("rendered kinds %v: want the claim, no state Secret, no Role (a directory needs no Secret access, and one replica no Lease)", k)
			}
		}},
		{"revocation", "revocation: {enabled: true, crlValidity: 12h, crlRefreshAt: 0.25}", func(t *testing.T, objs []*unstructured.Unstructured) {
			// Nothing of Istio's is published: istio-ca-crl is not either.
			wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args,
				[]string{"--crl", "--crl-validity=12h", "--crl-refresh-at=0.25"}, []string{"--publish-crl", "--publish-root-cert-configmaps"})
		}},
		{"revocation where meshca publishes the root: one switch", "revocation: {enabled: true}\ntrust: {rootCertConfigMaps: {enabled: true}}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args,
					[]string{"--crl", "--publish-root-cert-configmaps", "--publish-crl"}, nil)
				named := false
				for _, r := range clusterRole(t, objs).Rules {
					named = named || slices.Equal(r.ResourceNames, []string{"istio-ca-root-cert", "istio-ca-crl"})
				}
				if !named {
					t.Errorf("ClusterRole %+v: want a rule on the ConfigMaps istio-ca-root-cert and istio-ca-crl", clusterRole(t, objs).Rules)
				}
			}},
		{"root publishing with vault leaves Vault's CRLs unpublished", "trust: {rootCertConfigMaps: {enabled: true}}\n" + vault +
			"    auth: {method: kubernetes, kubernetes: {role: meshca}}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args,
					[]string{"--signer=vault", "--publish-root-cert-configmaps"}, []string{"--publish-crl"})
			}},
		{"istio without revocation on a plugged-in CA", "istio: {enabled: true}\nstate: {type: cacerts}", func(t *testing.T, objs []*unstructured.Unstructured) {
			// No CRL to publish: istio-ca-crl is not written either.
			wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args, []string{"--publish-root-cert-configmaps"}, []string{"--crl", "--publish-crl"})
		}},
		{"istio with vault publishes Vault's CRLs", "istio: {enabled: true}\n" + vault + "    istiodRole: istiod\n    auth: {method: kubernetes, kubernetes: {role: meshca}}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args, []string{"--signer=vault", "--publish-crl"}, []string{"--crl"})
			}},
		{"istio with cfssl publishes no CRL", "istio: {enabled: true}\nsigner: {type: cfssl, servingCertificate: {secretName: s}, cfssl: {url: https://c:8888, istiodProfile: istiod}}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args, []string{"--signer=cfssl", "--publish-root-cert-configmaps"}, []string{"--crl", "--publish-crl"})
			}},
		{"plugged-in cacerts", "replicaCount: 3\nstate: {type: cacerts, cacerts: {secretName: cacerts}}", func(t *testing.T, objs []*unstructured.Unstructured) {
			d := deployment(t, objs)
			wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--ca-dir=/etc/cacerts"}, []string{"--state-secret", "--auto-rotate"})
			wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"cacerts": "cacerts"})
			// meshca follows the Secret as its owner renews it: a subPath
			// mount would never see a renewal.
			for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
				if m.Name == "cacerts" && (m.SubPath != "" || m.SubPathExpr != "") {
					t.Errorf("the cacerts Secret is mounted with a subPath (%+v), which the kubelet never updates", m)
				}
			}
			if k := kinds(objs); k["CronJob"] != 0 || k["Secret"] != 0 {
				t.Errorf("rendered kinds %v: an imported CA has no state to rotate", k)
			}
		}},
		{"vault kubernetes login", vault + "    auth: {method: kubernetes, kubernetes: {role: meshca}}", func(t *testing.T, objs []*unstructured.Unstructured) {
			d := deployment(t, objs)
			wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--vault-kubernetes-role=meshca"},
				[]string{"--vault-kubernetes-token-file", "--vault-token-file", "--vault-approle"})
			wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"serving": "serving"})
		}},
		{"vault kubernetes login with an audience", vault + "    auth: {method: kubernetes, kubernetes: {role: meshca, mount: k8s-east, audience: vault}}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				d := deployment(t, objs)
				wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--vault-kubernetes-role=meshca",
					"--vault-kubernetes-mount=k8s-east", "--vault-kubernetes-token-file=/var/run/secrets/vault/token"}, nil)
				var projected *corev1.ProjectedVolumeSource
				for _, v := range d.Spec.Template.Spec.Volumes {
					if v.Name == "vault-sa-token" {
						projected = v.Projected
					}
				}
				if projected == nil || projected.Sources[0].ServiceAccountToken.Audience != "vault" {
					t.Errorf("volumes %+v: want a service-account token projected for audience vault", d.Spec.Template.Spec.Volumes)
				}
			}},
		{"vault token login", vault + "    auth: {method: token, token: {secretName: vault-token, key: t}}", func(t *testing.T, objs []*unstructured.Unstructured) {
			d := deployment(t, objs)
			wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--vault-token-file=/etc/meshca/vault-token/t"}, []string{"--vault-kubernetes-role"})
			wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"serving": "serving", "vault-token": "vault-token"})
		}},
		{"trust publishers switched over", "trust:\n  rootCertConfigMaps: {enabled: false}\n  clusterTrustBundle: {enabled: true, signerName: meshca.io/svid}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				d := deployment(t, objs)
				wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--publish-cluster-trust-bundle",
					"--cluster-trust-bundle-signer-name=meshca.io/svid"}, []string{"--publish-root-cert-configmaps"})
				r := clusterRole(t, objs)
				checkClusterRole(t, r, []string{"tokenreviews", "pods", "clustertrustbundles", "clustertrustbundles", "signers"})
				const certs = "certificates.k8s.io"
				wantRules(t, "ClusterRole meshca's trust bundle rules", r.Rules[2:], []rbacv1.PolicyRule{
					{APIGroups: []string{certs}, Resources: []string{"clustertrustbundles"}, ResourceNames: []string{"meshca.io:svid:cluster.local"},
						Verbs: []string{"list", "watch", "update"}},
					{APIGroups: []string{certs}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"create"}},
					{APIGroups: []string{certs}, Resources: []string{"signers"}, ResourceNames: []string{"meshca.io/svid"}, Verbs: []string{"attest"}},
				})
			}},
		{"k8scsr in another cluster with pinned roots", "signer:\n  type: k8scsr\n  servingCertificate: {secretName: serving}\n" +
			"  trustAnchors: {secretName: mesh-roots, key: roots.pem}\n  k8scsr:\n    signerName: example.com/meshca\n" +
			"    kubeconfig: {secretName: signer-cluster, key: config}\nstate: {type: none}",
			func(t *testing.T, objs []*unstructured.Unstructured) {
				d := deployment(t, objs)
				wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--signer=k8scsr", "--k8scsr-signer-name=example.com/meshca",
					"--k8scsr-kubeconfig=/etc/meshca/k8scsr-kubeconfig/config", "--trust-anchors=/etc/meshca/trust-anchors/roots.pem"},
					[]string{"--state-secret", "--auto-rotate", "--kubeconfig"})
				wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"serving": "serving",
					"trust-anchors": "mesh-roots", "k8scsr-kubeconfig": "signer-cluster"})
				// The requests go to the other cluster: nothing on them here.
				checkClusterRole(t, clusterRole(t, objs), []string{"tokenreviews", "pods"})
				if k := kinds(objs); k["CronJob"] != 0 || k["Secret"] != 0 {
					t.Errorf("rendered kinds %v: a pinned trust bundle has no CA state to rotate or store", k)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(tt.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			objs := render(t, ns, "--values", file)
			checkPodSecurity(t, objs)
			checkPodSelectors(t, objs)
			tt.check(t, objs)
			apply(t, objs, true)
		})
	}
}

// wantClaim: the volumes are exactly the state claim.
func wantClaim(t *testing.T, what string, vols []corev1.Volume) {
	t.Helper()
	if len(vols) != 1 || vols[0].PersistentVolumeClaim == nil || vols[0].PersistentVolumeClaim.ClaimName != "meshca-state" {
		t.Errorf("%s volumes %+v: want the claim meshca-state", what, vols)
	}
}
