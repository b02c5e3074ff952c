package csr_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/benchbase"
)

// BenchmarkBaselineECDSAVerify is the cost of the one verification every
// request needs: ECDSA P-256 over a SHA-256 digest.
func BenchmarkBaselineECDSAVerify(b *testing.B) { benchECDSAVerify(b) }

func benchECDSAVerify(b *testing.B) {
	verify := newECDSAVerify()
	b.ReportAllocs()
	for b.Loop() {
		verify()
	}
}

// newECDSAVerify returns a function that verifies one P-256 signature over
// a SHA-256 digest.
func newECDSAVerify() func() {
	key := p256Key().(*ecdsa.PrivateKey)
	digest := sha256.Sum256([]byte("certification request info"))
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		panic(err)
	}
	pub := &key.PublicKey
	return func() {
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			panic("signature does not verify")
		}
	}
}

// verifyNsPerOp and rawSignNsPerOp are measured once per run.
var verifyNsPerOp = sync.OnceValue(func() float64 { return benchbase.NsPerOp(newECDSAVerify()) })

// BenchmarkParseAndCheck is what the CA does with ztunnel's request before
// signing: Parse (PEM, DER, signature) and Check.
// x-verify is its cost divided by one ECDSA P-256 verification and
// x-rawsign by one raw certificate issuance (benchbase.RawSign), both
// measured in the same run.
func BenchmarkParseAndCheck(b *testing.B) {
	data := ztunnelPEM(b, p256Key(), testID)
	policy := csr.DefaultPolicy()
	verify, sign := verifyNsPerOp(), benchbase.RawSign()

	b.ReportAllocs()
	n := 0
	for b.Loop() {
		req, err := csr.Parse(data)
		if err != nil {
			b.Fatal(err)
		}
		if err := policy.Check(req, testID); err != nil {
			b.Fatal(err)
		}
		n++
	}
	benchbase.Report(b, n, verify, "verify")
	benchbase.Report(b, n, sign, "rawsign")
}
