// Package benchbase measures baselines inside a benchmark run, so that
// benchmarks can report their cost as a ratio to work this machine did in
// the same run rather than as absolute times on a noisy machine.
package benchbase

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// NsPerOp times f, doubling the count until the loop runs for at least
// 200ms, as testing.Benchmark would. (A running benchmark cannot call
// testing.Benchmark: both take the testing package's benchmark lock.)
func NsPerOp(f func()) float64 {
	f() // warm up
	for n := 16; ; n *= 2 {
		start := time.Now()
		for range n {
			f()
		}
		if d := time.Since(start); d >= 200*time.Millisecond || n >= 1<<24 {
			return float64(d.Nanoseconds()) / float64(n)
		}
	}
}

// RawSign is the cost of the raw work of issuing a workload certificate:
// x509.CreateCertificate (which makes one ECDSA P-256 signature) of a
// leaf template like meshca's, by a P-256 CA. Measured once per run.
var RawSign = sync.OnceValue(func() float64 {
	return NsPerOp(NewRawSign())
})

// NewRawSign returns one raw issuance as a function.
func NewRawSign() func() {
	sign := newLeafSigner()
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return func() { sign(leafKey.Public()) }
}

// NewRawIssuance returns, as a function safe for concurrent use, the work
// no design of a CA can skip for one request: decode a PEM PKCS#10
// request, parse it, verify its signature, and issue a leaf for its key
// (x509.CreateCertificate, as in NewRawSign). csrs are used in turn.
func NewRawIssuance(csrs [][]byte) func() {
	sign := newLeafSigner()
	var next atomic.Uint64
	return func() {
		block, _ := pem.Decode(csrs[next.Add(1)%uint64(len(csrs))])
		if block == nil {
			panic("benchbase: CSR is not PEM")
		}
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			panic(err)
		}
		if err := req.CheckSignature(); err != nil {
			panic(err)
		}
		sign(req.PublicKey)
	}
}

// newLeafSigner returns a function that issues a workload leaf like
// meshca's for a public key, signed by a P-256 CA.
func newLeafSigner() func(pub any) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: now, NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, caKey.Public(), caKey)
	if err != nil {
		panic(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	u, _ := url.Parse("spiffe://cluster.local/ns/default/sa/bench")
	leaf := &x509.Certificate{
		SerialNumber: new(big.Int).Lsh(big.NewInt(1), 127), NotBefore: now, NotAfter: now.Add(time.Hour),
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		SubjectKeyId: []byte{1, 2, 3, 4},
	}
	return func(pub any) {
		if _, err := x509.CreateCertificate(rand.Reader, leaf, caCert, pub, caKey); err != nil {
			panic(err)
		}
	}
}

// Report adds the metric "x-<name>": the benchmark's ns/op divided by
// baseline ns/op. Call it after the b.Loop loop with the iteration count.
func Report(b *testing.B, n int, baseline float64, name string) {
	if n == 0 || baseline <= 0 {
		return
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/baseline, "x-"+name)
}
