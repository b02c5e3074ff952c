package testca

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// WriteCACerts writes ca into dir in Istio's cacerts layout, a file at a
// time as an operator copying files would: roots in root-cert.pem (ca's
// own root when none are given), ca and the intermediates above it in
// cert-chain.pem, ca in ca-cert.pem, and its key in ca-key.pem (0600).
func (ca *CA) WriteCACerts(tb testing.TB, dir string, roots ...*x509.Certificate) {
	tb.Helper()
	a := ca.Authority(roots...)
	key, err := pemutil.EncodePrivateKey(ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{keymgr.FileRootCert, pemutil.EncodeCertificates(a.Roots...), 0o644},
		{keymgr.FileCertChain, pemutil.EncodeCertificates(append([]*x509.Certificate{ca.Cert}, a.Chain...)...), 0o644},
		{keymgr.FileCACert, pemutil.EncodeCertificates(ca.Cert), 0o644},
		{keymgr.FileCAKey, key, 0o600},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			tb.Fatal(err)
		}
	}
}
