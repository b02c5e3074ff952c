package trustprom_test

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/internal/metricstest"
	"github.com/meshca/meshca/internal/testca"
)

// crlPEM is a CRL of issuer valid from this to next, as PEM.
func crlPEM(t *testing.T, issuer *testca.CA, this, next time.Time) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1),
		ThisUpdate: this, NextUpdate: next}, issuer.Cert, issuer.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}

// TestCRLExpiry: the gauges report the CRL with the earliest nextUpdate
// among those published (PEM CRLs concatenated, or one DER CRL), and
// vanish when the replica stops publishing or publishes nothing that
// parses.
func TestCRLExpiry(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	inter := root.NewIntermediate(t, "intermediate", testca.Options{})
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	early := crlPEM(t, inter, t0.Add(time.Hour), t0.Add(5*time.Hour))
	late := crlPEM(t, root, t0, t0.Add(24*time.Hour))
	block, _ := pem.Decode(late)
	for _, tc := range []struct {
		name       string
		bundle     []byte
		this, next time.Time
		present    bool
	}{
		{"two CRLs: the earliest", append(append([]byte(nil), late...), early...), t0.Add(time.Hour), t0.Add(5 * time.Hour), true},
		{"one DER CRL", block.Bytes, t0, t0.Add(24 * time.Hour), true},
		{"stopped publishing", nil, time.Time{}, time.Time{}, false},
		{"nothing parses", []byte("-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"), time.Time{}, time.Time{}, false},
		{"a certificate only", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}), time.Time{}, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			e, err := trustprom.NewCRLExpiry(reg)
			if err != nil {
				t.Fatal(err)
			}
			e.Published(late) // a bundle before: replaced by the case's
			e.Published(tc.bundle)
			next, okNext := metricstest.Sample(t, reg, "meshca_trust_crl_next_update_timestamp_seconds", nil)
			this, okThis := metricstest.Sample(t, reg, "meshca_trust_crl_this_update_timestamp_seconds", nil)
			if okNext != tc.present || okThis != tc.present {
				t.Fatalf("present %v/%v, want %v", okNext, okThis, tc.present)
			}
			if tc.present && (next != float64(tc.next.Unix()) || this != float64(tc.this.Unix())) {
				t.Errorf("next %v this %v, want %v %v", next, this, tc.next.Unix(), tc.this.Unix())
			}
		})
	}
}
