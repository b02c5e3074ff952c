package signers

import (
	"context"
	"crypto/x509"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkVaultOverhead issues the same CSRs with the same concurrency
// twice in one run: straight to Vault's pki/sign/<role>, and through
// meshca (TLS, TokenReview cache, CSR policy, Vault, chain verification).
// x-direct is meshca's wall time over Vault's (goal: at most 1.10).
func BenchmarkVaultOverhead(b *testing.B) {
	const requests = 400
	concurrency := benchConcurrency
	p := newPKI(b)
	v := harness.StartVault(b, vaultBin)
	v.ConfigurePKI(b, "pki", p.inter.Authority(), harness.VaultRole{})
	p.write(b, "vault.token", []byte(harness.VaultRootToken))
	m := harness.StartMeshca(b, bin, "--signer", "vault", "--kubeconfig", cluster.Kubeconfig,
		"--vault-addr", v.Addr, "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole, "--vault-rsa-role", harness.VaultRSARole, "--vault-token-file", p.path("vault.token"),
		"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem"))
	w := cluster.NewWorkload(b, cluster.Namespace(b, "bench"), "frontend", "node-a")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	csrs := make([]string, 64)
	for i := range csrs {
		_, csrs[i] = harness.KeyAndCSR(b, id)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.root.Cert)
	client, err := caclient.New(caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots, TokenFile: harness.WriteToken(b, w.Token)})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	direct := func(i int) error {
		_, err := v.Client.Logical().WriteWithContext(context.Background(), "pki/sign/mesh", map[string]any{
			"csr": csrs[i%len(csrs)], "uri_sans": id.String(), "ttl": "86400s", "format": "pem", "exclude_cn_from_sans": true,
		})
		return err
	}
	viaMeshca := func(i int) error {
		_, err := client.Call(context.Background(), csrs[i%len(csrs)], id, caclient.Options{})
		return err
	}
	run := func(f func(int) error) time.Duration {
		var wg sync.WaitGroup
		next := make(chan int)
		start := time.Now()
		for range concurrency {
			wg.Go(func() {
				for i := range next {
					if err := f(i); err != nil {
						b.Error(err)
					}
				}
			})
		}
		for i := range requests {
			next <- i
		}
		close(next)
		wg.Wait()
		return time.Since(start)
	}
	_, _ = run(direct), run(viaMeshca) // warm both paths
	var dDirect, dMeshca time.Duration
	for b.Loop() {
		dDirect += run(direct)
		dMeshca += run(viaMeshca)
	}
	n := float64(b.N * requests)
	b.ReportMetric(n/dDirect.Seconds(), "direct-signs/s")
	b.ReportMetric(n/dMeshca.Seconds(), "meshca-signs/s")
	b.ReportMetric(float64(dMeshca)/float64(dDirect), "x-direct")
}

// benchConcurrency is the number of clients of BenchmarkVaultOverhead;
// MESHCA_BENCH_CONCURRENCY overrides it.
var benchConcurrency = func() int {
	if n, err := strconv.Atoi(os.Getenv("MESHCA_BENCH_CONCURRENCY")); err == nil && n > 0 {
		return n
	}
	return 8
}()
