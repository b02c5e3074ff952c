package cfssl_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/cfssl/config"
	cflog "github.com/cloudflare/cfssl/log"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestMain(m *testing.M) {
	cflog.Level = cflog.LevelCritical
	os.Exit(m.Run())
}

var testID = spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")

func TestContractLocal(t *testing.T) {
	signertest.Run(t, signertest.Backend{
		DNS: true,
		New: func(t testing.TB, a *keymgr.Authority) signer.Signer {
			s, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: a.Cert, CAKey: a.Key, Chain: a.Chain, DNSProfile: cfssl.DefaultIstiodProfile})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestLocalProfileUsages: in process, a profile's usages bound what meshca
// may ask for, and the certificate carries exactly what meshca derives
// from the key: a wider profile issues no more, a narrower one refuses.
func TestLocalProfileUsages(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		name   string
		usages []string
		key    string
		want   string // "" issues exactly the workload usages
	}{
		{"cert sign granted, EC", []string{"digital signature", "cert sign", "key encipherment", "server auth", "client auth"}, "ec", ""},
		{"cert sign granted, RSA", []string{"signing", "cert sign", "key encipherment", "server auth", "client auth"}, "rsa", ""},
		{"code signing granted", []string{"digital signature", "server auth", "client auth", "code signing"}, "ec", ""},
		{"EC without key encipherment", []string{"digital signature", "server auth", "client auth"}, "ec", ""},
		{"RSA without key encipherment", []string{"digital signature", "server auth", "client auth"}, "rsa", `does not allow the usages ["key encipherment"]`},
		{"no client auth", []string{"digital signature", "server auth"}, "ec", `does not allow the usages ["client auth"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := &config.Signing{Default: &config.SigningProfile{Usage: tt.usages, Expiry: 24 * time.Hour, ExpiryString: "24h"}}
			s, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: root.Cert, CAKey: root.Key, Policy: policy})
			if err != nil {
				t.Fatal(err)
			}
			req := request(t, newKey(t, tt.key), pkix.Name{})
			res, err := s.Sign(context.Background(), req)
			if tt.want != "" {
				if signer.KindOf(err) != signer.KindRefused || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want refused with %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Leaf.KeyUsage != req.Usages.Key {
				t.Fatalf("key usage %q, want %q", csr.Usages{Key: res.Leaf.KeyUsage}.Names(), req.Usages.Names())
			}
		})
	}
}

func TestLocalUnknownUsage(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	policy := &config.Signing{Default: &config.SigningProfile{Usage: []string{"digital signature", "server auth", "client auth", "world domination"}, Expiry: time.Hour, ExpiryString: "1h"}}
	_, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: root.Cert, CAKey: root.Key, Policy: policy})
	if err == nil || !strings.Contains(err.Error(), `profile "default"`) || !strings.Contains(err.Error(), "world domination") {
		t.Fatalf("err = %v, want the unknown usage named", err)
	}
}

// TestLocalSubjectNeverCopied: in process, a policy that would copy the
// CSR's subject, names and extensions into the certificate is overridden:
// the leaf has an empty subject and the SPIFFE ID as its only SAN.
func TestLocalSubjectNeverCopied(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	permissive := func() *config.SigningProfile {
		return &config.SigningProfile{
			Usage: []string{"digital signature", "key encipherment", "server auth", "client auth"}, Expiry: time.Hour, ExpiryString: "1h",
			CSRWhitelist:   &config.CSRWhitelist{Subject: true, PublicKey: true, PublicKeyAlgorithm: true, SignatureAlgorithm: true, DNSNames: true, URIs: true, EmailAddresses: true, IPAddresses: true},
			CopyExtensions: true,
		}
	}
	tests := []struct {
		name    string
		policy  *config.Signing
		subject pkix.Name
	}{
		{"default policy, organization", nil, pkix.Name{Organization: []string{"system:masters"}, OrganizationalUnit: []string{"cluster-admins"}}},
		{"default policy, common name", nil, pkix.Name{CommonName: testID.String()}},
		{"default policy, istio-agent", nil, pkix.Name{Organization: []string{""}}},
		{"whitelist copying the subject", &config.Signing{Default: permissive()}, pkix.Name{Organization: []string{"system:masters"}}},
		{"no whitelist", &config.Signing{Default: &config.SigningProfile{Usage: []string{"digital signature", "server auth", "client auth"}, Expiry: time.Hour, ExpiryString: "1h"}}, pkix.Name{Organization: []string{"system:masters"}, Country: []string{"XX"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: root.Cert, CAKey: root.Key, Policy: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Sign(context.Background(), request(t, newKey(t, "ec"), tt.subject))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Leaf.Subject.Names) != 0 {
				t.Fatalf("leaf subject %q, want empty", res.Leaf.Subject)
			}
			if len(res.Leaf.URIs) != 1 || res.Leaf.URIs[0].String() != testID.String() {
				t.Fatalf("leaf URIs %v, want %s", res.Leaf.URIs, testID)
			}
		})
	}
}

var (
	rsaOnce sync.Once
	rsaKey  *rsa.PrivateKey
)

func newKey(t *testing.T, kind string) crypto.Signer {
	t.Helper()
	if kind == "rsa" {
		rsaOnce.Do(func() { rsaKey, _ = rsa.GenerateKey(rand.Reader, 2048) })
		return rsaKey
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// request is a signing request for testID whose CSR carries subject, as
// csr.Check lets it through.
func request(t *testing.T, key crypto.Signer, subject pkix.Name) *signer.Request {
	t.Helper()
	san, err := csr.MarshalURISAN(testID.String())
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject, ExtraExtensions: []pkix.Extension{san}}, key)
	if err != nil {
		t.Fatal(err)
	}
	req, err := csr.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.DefaultPolicy().Check(req, testID); err != nil {
		t.Fatal(err)
	}
	return &signer.Request{CSR: req, ID: testID, TTL: time.Hour, Usages: csr.WorkloadUsages(req.PublicKey)}
}
