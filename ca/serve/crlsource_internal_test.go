package serve

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
)

// answers is a Revoker whose CRLs are the next of its answers.
type answers struct {
	crls [][][]byte
	errs []error
}

func (*answers) Revoke(context.Context, signer.Revocation) error { return nil }

func (a *answers) CRLs(context.Context) ([][]byte, error) {
	crls, err := a.crls[0], a.errs[0]
	a.crls, a.errs = a.crls[1:], a.errs[1:]
	return crls, err
}

// TestCRLSourceKeepsLast: the backend's CRLs are published with the CA
// state's version; a failed read, or one with no CRL, keeps the last ones
// (and is counted), never an empty bundle.
func TestCRLSourceKeepsLast(t *testing.T) {
	down := signer.Errorf("vault", signer.KindUnavailable, "connection refused")
	crlA, crlB := []byte("crl-a"), []byte("crl-b")
	tests := []struct {
		name    string
		crls    [][][]byte
		errs    []error
		want    [][]byte // the published CRLs after each read; nil: none
		changes int
		errors  float64
	}{
		{"first read fails", [][][]byte{nil, {crlA}}, []error{down, nil}, [][]byte{nil, crlA}, 1, 1},
		{"backend away keeps the last", [][][]byte{{crlA}, nil, nil}, []error{nil, down, down}, [][]byte{crlA, crlA, crlA}, 1, 2},
		{"no CRL keeps the last", [][][]byte{{crlA}, {}}, []error{nil, nil}, [][]byte{crlA, crlA}, 1, 1},
		{"a new CRL replaces it", [][][]byte{{crlA}, {crlA}, {crlB}}, []error{nil, nil, nil}, [][]byte{crlA, crlA, crlB}, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := trustprom.NewCRLSource(reg, "vault")
			if err != nil {
				t.Fatal(err)
			}
			be := &backend{name: "vault"}
			be.version.Store(&trust.BundleVersion{Lineage: "l", Sequence: 7})
			src := newCRLSource(be, &answers{crls: tt.crls, errs: tt.errs}, time.Hour, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
			changes := 0
			src.changed = func() { changes++ }
			for i, want := range tt.want {
				src.read(t.Context())
				got := be.crlBundle()
				if want == nil {
					if len(got.PEM) != 0 {
						t.Fatalf("read %d: published %q, want nothing", i, got.PEM)
					}
					continue
				}
				block, _ := pem.Decode(got.PEM)
				if block == nil || block.Type != "X509 CRL" || string(block.Bytes) != string(want) {
					t.Fatalf("read %d: published %q, want the CRL %q", i, got.PEM, want)
				}
				if got.Version != (trust.BundleVersion{Lineage: "l", Sequence: 7}) {
					t.Fatalf("read %d: version %+v, want the CA state's", i, got.Version)
				}
			}
			if changes != tt.changes {
				t.Errorf("publishers told %d times, want %d", changes, tt.changes)
			}
			if got := errorReads(t, reg); got != tt.errors {
				t.Errorf("error reads = %v, want %v", got, tt.errors)
			}
		})
	}
}

// TestPublishCRLNeedsASource: --publish-crl with a backend that keeps no
// CRL is refused, naming the flag and docs/backends.md.
func TestPublishCRLNeedsASource(t *testing.T) {
	be := &backend{name: "cfssl"}
	_, err := newBackendCRLs(Trust{CRL: true}, be, prometheus.NewRegistry(), slog.Default())
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "publish-crl" || !strings.Contains(err.Error(), "docs/backends.md") {
		t.Fatalf("err = %v, want a FieldError on publish-crl naming docs/backends.md", err)
	}
	be = &backend{name: BackendLocal}
	if src, err := newBackendCRLs(Trust{CRL: true}, be, prometheus.NewRegistry(), slog.Default()); src != nil || err != nil {
		t.Fatalf("built-in CA: %v, %v; want no source (its CRLs are the CA state's)", src, err)
	}
}

// errorReads is meshca_trust_crl_source_reads_total{result="error"} in reg.
func errorReads(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshca_trust_crl_source_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == trustprom.CRLSourceError {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("no meshca_trust_crl_source_reads_total{result=\"error\"}")
	return 0
}

// TestCRLSourceCovers: Vault's CRLs are taken only when they include the
// CA that signs the leaves and, for an intermediate, the CA over it:
// without, ztunnel would refuse every certificate.
func TestCRLSourceCovers(t *testing.T) {
	root := testca.NewRoot(t, "cover root", testca.Options{})
	inter := root.NewIntermediate(t, "cover intermediate", testca.Options{})
	crl := func(ca *testca.CA) []byte {
		der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1),
			ThisUpdate: time.Now(), NextUpdate: time.Now().Add(time.Hour)}, ca.Cert, ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	tests := []struct {
		name    string
		signing *x509.Certificate
		crls    [][]byte
		want    string
	}{
		{"a root signing, its CRL", root.Cert, [][]byte{crl(root)}, ""},
		{"an intermediate with the root's CRL", inter.Cert, [][]byte{crl(inter), crl(root)}, ""},
		{"an intermediate without the root's CRL", inter.Cert, [][]byte{crl(inter)},
			`no CRL of "CN=cover root,O=meshca test", which signs the intermediate "CN=cover intermediate,O=meshca test"`},
		{"none of the signing CA", inter.Cert, [][]byte{crl(root)}, `no CRL of "CN=cover intermediate,O=meshca test", which signs the certificates`},
		{"pinned anchors: not known", nil, [][]byte{crl(root)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := covers("vault", tt.crls, tt.signing)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || signer.KindOf(err) != signer.KindRefused {
				t.Fatalf("err = %v, want a refusal with %q", err, tt.want)
			}
		})
	}
}

// TestCRLSourceRevokedRenewal: a serial Vault's CRL lists is revoked for
// the server (no renewal by that certificate), whatever the CA state
// says, and stays so while Vault cannot be read; a serial not listed is
// not.
func TestCRLSourceRevokedRenewal(t *testing.T) {
	root := testca.NewRoot(t, "renewal root", testca.Options{})
	revoked, kept := big.NewInt(0x5eed), big.NewInt(0x600d)
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now(),
		NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: revoked, RevocationTime: time.Now()}}},
		root.Cert, root.Key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := trustprom.NewCRLSource(prometheus.NewRegistry(), "vault")
	if err != nil {
		t.Fatal(err)
	}
	be := &backend{name: "vault", signing: func() *x509.Certificate { return root.Cert }}
	src := newCRLSource(be, &answers{crls: [][][]byte{{der}, nil}, errs: []error{nil, signer.Errorf("vault", signer.KindUnavailable, "down")}},
		time.Hour, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	be.crlSource = src
	issuer := "0123"
	if be.Revoked(revoked, issuer) {
		t.Fatal("revoked before Vault's CRL is read")
	}
	for i := range 2 {
		src.read(t.Context())
		if !be.Revoked(revoked, issuer) || be.Revoked(kept, issuer) {
			t.Fatalf("read %d: Revoked(listed) = %v, Revoked(not listed) = %v; want true, false", i, be.Revoked(revoked, issuer), be.Revoked(kept, issuer))
		}
	}
}
