package istioclient

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"istio.io/istio/pkg/security"
	"istio.io/istio/pkg/spiffe"
	"istio.io/istio/security/pkg/credentialfetcher"
	"istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel"
	"istio.io/istio/security/pkg/pki/util"

	"github.com/meshca/meshca/integration/harness"
)

const (
	trustDomain = "cluster.local"
	clusterID   = "Kubernetes"
	// caSAN is the name istio-agent expects on istiod's serving certificate.
	caSAN = "istiod.istio-system.svc"
	// secretTTL is istio-agent's default SECRET_TTL.
	secretTTL = 24 * time.Hour
)

// server is one `meshca serve` with a fresh state directory and its root
// bundle written to a file, as istio-agent reads it.
type server struct {
	*harness.Meshca
	rootsPEM  []byte
	rootsFile string
}

func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	m := harness.StartSelfSigned(t, bin, cluster.Kubeconfig, extra...)
	rootsFile := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(rootsFile, m.RootsPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return &server{Meshca: m.Meshca, rootsPEM: m.RootsPEM, rootsFile: rootsFile}
}

// istioClient builds Istio's citadel client the way pilot-agent does: a
// JWT credential fetcher on the token file and TLS to the CA endpoint with
// the istiod SAN and the mounted root certificate.
func (s *server) istioClient(t *testing.T, token string) *citadel.CitadelClient {
	t.Helper()
	fetcher, err := credentialfetcher.NewCredFetcher(security.JWT, trustDomain, harness.WriteToken(t, token), "")
	if err != nil {
		t.Fatal(err)
	}
	opts := &security.Options{
		CAEndpoint:     s.Addr,
		CAEndpointSAN:  caSAN,
		CAProviderName: "Citadel",
		ClusterID:      clusterID,
		TrustDomain:    trustDomain,
		CredFetcher:    fetcher,
		SecretTTL:      secretTTL,
		CAHeaders:      map[string]string{},
	}
	c, err := citadel.NewCitadelClient(opts, &citadel.TLSOptions{RootCert: s.rootsFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func spiffeID(w *harness.Workload) string {
	return spiffe.Identity{TrustDomain: trustDomain, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount}.String()
}

// TestCSRSign: for each key type istio-agent can generate, its CSR signed
// through the citadel client yields a chain Istio's own checks accept.
func TestCSRSign(t *testing.T) {
	s := startServer(t)
	ns := cluster.Namespace(t, "istio")
	tests := []struct {
		name     string
		opts     util.CertOptions
		keyUsage x509.KeyUsage
	}{
		// istio-agent's default: WORKLOAD_RSA_KEY_SIZE=2048.
		{"rsa2048", util.CertOptions{RSAKeySize: 2048}, x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment},
		// ECC_SIGNATURE_ALGORITHM=ECDSA with the default ECC_CURVE=P256.
		{"ecdsa-p256", util.CertOptions{ECSigAlg: util.EcdsaSigAlg, ECCCurve: util.P256Curve}, x509.KeyUsageDigitalSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := cluster.NewWorkload(t, ns, "sa-"+tt.name, "node-a")
			id := spiffeID(w)
			tt.opts.Host = id
			csrPEM, keyPEM, err := util.GenCSR(tt.opts)
			if err != nil {
				t.Fatal(err)
			}

			chain, err := s.istioClient(t, w.Token).CSRSign(csrPEM, int64(secretTTL.Seconds()))
			if err != nil {
				t.Fatalf("CSRSign: %v\n%s", err, s.Logs())
			}
			if len(chain) < 2 {
				t.Fatalf("chain has %d certificates, want at least 2", len(chain))
			}
			harness.CheckReply(t, chain)

			leaf, err := util.ParsePemEncodedCertificate([]byte(chain[0]))
			if err != nil {
				t.Fatal(err)
			}
			ids, err := util.ExtractIDs(leaf.Extensions)
			if err != nil || !slices.Equal(ids, []string{id}) {
				t.Fatalf("leaf URI SANs %v (%v), want [%s]", ids, err, id)
			}

			// Verify as istio-agent would: the root is the chain's last element.
			root := chain[len(chain)-1]
			if err := util.VerifyCertificate(keyPEM, []byte(strings.Join(chain, "\n")), []byte(root), &util.VerifyFields{
				Host:        id,
				ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
				KeyUsage:    tt.keyUsage,
			}); err != nil {
				t.Fatalf("util.VerifyCertificate: %v", err)
			}
			if !strings.Contains(string(s.rootsPEM), strings.TrimSpace(root)) {
				t.Error("the chain's root is not in meshca's published root bundle")
			}
		})
	}
}

// TestCSRSignWrongServiceAccount: a token for one service account cannot
// sign a CSR naming another; Istio's client sees InvalidArgument.
func TestCSRSignWrongServiceAccount(t *testing.T) {
	s := startServer(t)
	ns := cluster.Namespace(t, "istio-mismatch")
	victim := cluster.NewWorkload(t, ns, "payments", "node-a")
	attacker := cluster.NewWorkload(t, ns, "frontend", "node-a")

	csrPEM, _, err := util.GenCSR(util.CertOptions{Host: spiffeID(victim), RSAKeySize: 2048})
	if err != nil {
		t.Fatal(err)
	}
	chain, err := s.istioClient(t, attacker.Token).CSRSign(csrPEM, int64(secretTTL.Seconds()))
	if err == nil {
		t.Fatalf("CSRSign succeeded with %d certificates, want an error", len(chain))
	}
	// CSRSign formats the gRPC status with %v, so only its text survives.
	if want := "code = " + codes.InvalidArgument.String(); !strings.Contains(err.Error(), want) {
		t.Fatalf("CSRSign error %q, want it to contain %q", err, want)
	}
}
