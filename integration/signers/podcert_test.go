package signers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodCertBackends: PodCertificateRequests signed through the external
// backends, as e2e's TestPodCert* sign them through the built-in CA. Each
// backend backdates on its own: in-process cfssl by meshca's --backdate,
// Vault by its role's not_before_duration (45 s here, not Vault's default,
// which meshca assumes when its token may not read the role, until an
// answer has taught it the role's: it then asks again, once),
// a remote cfssl by its profile. A request of the API's minimum lifetime,
// one hour, leaves no room for a backdate meshca did not count: it must
// come out exactly one hour long, and its chain verify to the signer's
// ClusterTrustBundle as the Pod's SVID. A remote cfssl's profile fixes the
// lifetime (24 h): a request that allows less is Failed (SignerRefused:
// the profile is the operator's to change), one that allows a day is
// Issued.
func TestPodCertBackends(t *testing.T) {
	p := newPKI(t)
	v := harness.StartVault(t, vaultBin)
	v.ConfigurePKI(t, "pki", p.inter.Authority(), harness.VaultRole{NotBefore: "45s"})
	signOnly := vaultPolicyToken(t, v, "meshca-sign", `path "pki/sign/*" { capabilities = ["create", "update"] }`)
	withRoles := vaultPolicyToken(t, v, "meshca-sign-roles", `path "pki/sign/*" { capabilities = ["create", "update"] }
path "pki/roles/*" { capabilities = ["read"] }`)
	p.write(t, "sign-only.token", []byte(signOnly))
	p.write(t, "with-roles.token", []byte(withRoles))
	cfssl := harness.StartCfssl(t, cfsslBin, p.inter.Authority(), harness.CfsslOptions{AuthKey: authKey})

	serving := []string{"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem")}
	vaultArgs := func(token string) []string {
		return slices.Concat([]string{"--signer", "vault", "--vault-addr", v.Addr, "--vault-pki-mount", "pki",
			"--vault-role", harness.VaultMainRole, "--vault-token-file", p.path(token)}, serving)
	}
	hour, day := int32(3600), int32(86400)
	tests := []struct {
		name string
		args []string
		// teach: a CreateCertificate answered first (Vault's answers
		// teach meshca the role's backdate when its token may not read
		// the role).
		teach bool
		max   int32
		want  string        // condition
		life  time.Duration // the certificate's, when Issued
	}{
		{"vault, role readable", vaultArgs("with-roles.token"), false, hour, "Issued", time.Hour},
		{"vault, sign only", vaultArgs("sign-only.token"), false, hour, "Issued", time.Hour},
		{"vault, sign only, after an answer", vaultArgs("sign-only.token"), true, day, "Issued", 24 * time.Hour},
		{"cfssl in process", slices.Concat([]string{"--signer", "cfssl", "--trust-anchors", p.path("anchors.pem"),
			"--cfssl-ca-cert", p.path("ca.pem"), "--cfssl-ca-key", p.path("ca-key.pem")}), false, hour, "Issued", time.Hour},
		{"cfssl remote, profile longer than allowed", slices.Concat([]string{"--signer", "cfssl", "--cfssl-url", cfssl.URL,
			"--cfssl-auth-key-file", p.path("auth.key")}, serving), false, hour, "Failed", 0},
		{"cfssl remote, profile allowed", slices.Concat([]string{"--signer", "cfssl", "--cfssl-url", cfssl.URL,
			"--cfssl-auth-key-file", p.path("auth.key")}, serving), false, day, "Issued", 24 * time.Hour},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := cluster.Namespace(t, "pcr-backend")
			signer := fmt.Sprintf("meshca.io/backend-%d-%d", i, time.Now().UnixNano()%1e9)
			ctb := strings.ReplaceAll(signer, "/", ":") + ":cluster.local"
			t.Cleanup(func() {
				_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), ctb, metav1.DeleteOptions{})
			})
			m := harness.StartMeshca(t, bin, slices.Concat([]string{"--kubeconfig", cluster.Kubeconfig,
				"--pod-certificate-signer-name", signer, "--trust-lease-namespace", ns}, tt.args)...)
			if !m.WaitForLog(20*time.Second, "signing PodCertificateRequests") {
				t.Fatalf("meshca did not start signing PodCertificateRequests:\n%s", m.Logs())
			}
			if tt.teach {
				if _, err := p.issue(t, m); err != nil {
					t.Fatal(err)
				}
			}
			node := cluster.KubeletNode(t, fmt.Sprintf("node-backend-%d-%d", i, time.Now().UnixNano()%1e9))
			sa := cluster.ServiceAccount(t, ns, "app")
			pod := node.Pod(t, ns, "app", sa, signer)
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			max := tt.max
			got, cond := cluster.AnsweredPodCertificate(t, node.Request(t, pod, sa, signer, key, &max), 30*time.Second)
			if cond.Type != tt.want {
				t.Fatalf("%s: %s, want %s\n%s", cond.Reason, cond.Message, tt.want, m.Logs())
			}
			if cond.Type != certv1.PodCertificateRequestConditionTypeIssued {
				// The profile, not the request, decides: the operator's
				// to change (the log names the setting).
				if cond.Reason != "SignerRefused" || !m.WaitForLog(5*time.Second, "set the profile's expiry") {
					t.Errorf("reason %s (%s), want SignerRefused, the log naming the profile's expiry:\n%s", cond.Reason, cond.Message, m.Logs())
				}
				return
			}
			chain, err := pemutil.ParseCertificates([]byte(got.Status.CertificateChain))
			if err != nil {
				t.Fatal(err)
			}
			leaf := chain[0]
			life := leaf.NotAfter.Sub(leaf.NotBefore)
			harness.Report(t, "maxExpirationSeconds %d: issued for %v", tt.max, life)
			if life != tt.life {
				t.Errorf("issued %v to %v, a lifetime of %v, want %v", leaf.NotBefore, leaf.NotAfter, life, tt.life)
			}
			verifyWithCTB(t, ctb, chain, spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", ns, "sa", sa.Name))
		})
	}
}

// verifyWithCTB verifies chain, as a Pod would, with the roots of the
// ClusterTrustBundle name, once meshca has published it.
func verifyWithCTB(t *testing.T, name string, chain []*x509.Certificate, want spiffeid.ID) {
	t.Helper()
	var bundle string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		b, err := cluster.Client.CertificatesV1().ClusterTrustBundles().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			bundle = b.Spec.TrustBundle
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClusterTrustBundle %s: %v", name, err)
		}
	}
	roots, err := pemutil.ParseCertificates([]byte(bundle))
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(want.TrustDomain(), roots))
	if err != nil || got != want {
		t.Fatalf("the chain against the ClusterTrustBundle: %v %v, want %v", got, err, want)
	}
}

// vaultPolicyToken creates the ACL policy name from hcl and returns a
// token that holds it (and Vault's default policy, for lookup-self).
func vaultPolicyToken(t *testing.T, v *harness.Vault, name, hcl string) string {
	t.Helper()
	ctx := context.Background()
	if err := v.Client.Sys().PutPolicyWithContext(ctx, name, hcl); err != nil {
		t.Fatalf("policy %s: %v", name, err)
	}
	s, err := v.Client.Auth().Token().CreateWithContext(ctx, &api.TokenCreateRequest{Policies: []string{name}, TTL: "2h"})
	if err != nil {
		t.Fatalf("token for %s: %v", name, err)
	}
	return s.Auth.ClientToken
}
