package csr_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"testing"

	"github.com/meshca/meshca/csr"
)

// BenchmarkBaselineECDSAVerify is the cost of the one verification every
// request needs: ECDSA P-256 over a SHA-256 digest.
func BenchmarkBaselineECDSAVerify(b *testing.B) { benchECDSAVerify(b) }

func benchECDSAVerify(b *testing.B) {
	key := p256Key().(*ecdsa.PrivateKey)
	digest := sha256.Sum256([]byte("certification request info"))
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		b.Fatal(err)
	}
	pub := &key.PublicKey
	b.ReportAllocs()
	for b.Loop() {
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			b.Fatal("signature does not verify")
		}
	}
}

// baselineNsPerOp measures the baseline once per run, so that
// BenchmarkParseAndCheck can report its cost as a multiple of it.
var baselineNsPerOp = sync.OnceValue(func() float64 {
	r := testing.Benchmark(benchECDSAVerify)
	if r.N == 0 {
		return 0
	}
	return float64(r.T.Nanoseconds()) / float64(r.N)
})

// BenchmarkParseAndCheck is what the CA does with ztunnel's request before
// signing: Parse (PEM, DER, signature) and Check. The x-baseline metric is
// its cost divided by that of BenchmarkBaselineECDSAVerify, measured in
// the same run.
func BenchmarkParseAndCheck(b *testing.B) {
	data := ztunnelPEM(b, p256Key(), testID)
	policy := csr.DefaultPolicy()
	baseline := baselineNsPerOp()

	b.ReportAllocs()
	b.ResetTimer()
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
	if baseline > 0 && n > 0 {
		nsPerOp := float64(b.Elapsed().Nanoseconds()) / float64(n)
		b.ReportMetric(nsPerOp/baseline, "x-baseline")
	}
}
