package signertest

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// FixedWorkloadKey is the workload key of the backends' fuzz targets,
// fixed so that a stored input (an answer certifying that key) reproduces
// against the request it is replayed with. A test key: it protects
// nothing.
const FixedWorkloadKey = `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg0WD5nIrBt0ze0waA
E7/dREvLGxurxTCtqF78EsShC1uhRANCAARRMxcP83XoRBOWjlGOMcp4whWfKwfg
/sokFZcptI8RnaCEHikwGOzicPBvIQ9hL3nsOaooWfbneYaymDwdgSgd
-----END PRIVATE KEY-----
`

// FixedKeyRequest is NewRequest with FixedWorkloadKey.
func FixedKeyRequest(tb testing.TB, id spiffeid.ID, ttl time.Duration) *signer.Request {
	tb.Helper()
	key, err := pemutil.ParsePrivateKey([]byte(FixedWorkloadKey))
	if err != nil {
		tb.Fatal(err)
	}
	return NewRequest(tb, id, key, ttl)
}

// NewRequest is a request for id and ttl whose CSR, made with key, is
// checked as ca checks it.
func NewRequest(tb testing.TB, id spiffeid.ID, key crypto.Signer, ttl time.Duration) *signer.Request {
	tb.Helper()
	p, err := csr.Build(key, id)
	if err != nil {
		tb.Fatal(err)
	}
	cr, err := csr.Parse(p)
	if err != nil {
		tb.Fatal(err)
	}
	return &signer.Request{CSR: cr, ID: id, TTL: ttl, Usages: csr.WorkloadUsages(cr.PublicKey)}
}

// WorkloadLeaf issues with ca the leaf a well-behaved backend returns for
// req: an empty subject, one critical URI SAN (req.ID), the workload
// usages, from notBefore to notAfter. The backends' fuzz targets seed
// their answers with it.
func WorkloadLeaf(tb testing.TB, ca *testca.CA, req *signer.Request, notBefore, notAfter time.Time) *x509.Certificate {
	tb.Helper()
	san, err := csr.MarshalURISAN(req.ID.String())
	if err != nil {
		tb.Fatal(err)
	}
	serial, err := certs.NewSerial()
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: req.Usages.Key, ExtKeyUsage: req.Usages.Ext, ExtraExtensions: []pkix.Extension{san},
	}, ca.Cert, req.CSR.PublicKey, ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return leaf
}
