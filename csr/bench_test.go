package csr_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
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

// baselineNsPerOp measures the baseline once per run, so that
// BenchmarkParseAndCheck can report its cost as a multiple of it.
//
// It cannot call testing.Benchmark: a running benchmark holds the testing
// package's benchmark lock, which testing.Benchmark takes too, so the call
// never returns. It times the loop itself instead, growing the count until
// the loop takes at least 200ms, as testing.Benchmark would.
var baselineNsPerOp = sync.OnceValue(func() float64 {
	verify := newECDSAVerify()
	verify() // warm up
	for n := 16; ; n *= 2 {
		start := time.Now()
		for range n {
			verify()
		}
		if d := time.Since(start); d >= 200*time.Millisecond || n >= 1<<24 {
			return float64(d.Nanoseconds()) / float64(n)
		}
	}
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
