package signers

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	"github.com/meshca/meshca/internal/pemutil"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkVaultOverhead issues the same CSRs at the same concurrency, in
// one run, straight to Vault's pki/sign/<role> and through meshca (TLS,
// TokenReview cache, CSR policy, Vault, verification of the chain), the
// two in turn for every iteration (-benchtime Nx: N rounds; the best
// round of each counts, as other work on a shared machine only slows
// one down; with MESHCA_BENCH_PROFILE the first meshca round is
// profiled). Both clients are lean (no per-request file reads, no checks
// of the replies, which the harness's checked client would add to one
// side only; one reply of each is checked, outside the timing), and
// meshca's audit log goes to a file, not through the harness.
//
// x-direct is meshca's time over Vault's (goal: at most 1.10); x-cpu is
// the same for the CPU time of Vault, meshca and this process together,
// which noise does not move, and the µs metrics are each one's CPU per
// request (on shared cores). Every round runs both paths again with Vault
// pinned to one core and meshca and the client to the other (taskset), as
// when each runs on a machine of its own: x-direct-pinned and
// x-p50-pinned (the median latency's ratio). MESHCA_BENCH_PROFILE=<dir> also profiles meshca (during the
// first round) and logs where its CPU went.
func BenchmarkVaultOverhead(b *testing.B) {
	concurrency := benchConcurrency
	p := newPKI(b)
	v := harness.StartVault(b, vaultBin)
	v.ConfigurePKI(b, "pki", p.inter.Authority(), harness.VaultRole{})
	p.write(b, "vault.token", []byte(harness.VaultRootToken))
	profile := os.Getenv("MESHCA_BENCH_PROFILE")
	args := []string{"--signer", "vault", "--kubeconfig", cluster.Kubeconfig,
		"--vault-addr", v.Addr, "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole, "--vault-rsa-role", harness.VaultRSARole, "--vault-token-file", p.path("vault.token"),
		"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem"),
		"--audit-log-file", filepath.Join(b.TempDir(), "audit.log")}
	args = append(args, load.Unlimited(bin)...) // the cost of a request, not one caller's budget
	if profile != "" {
		args = append(args, "--enable-pprof")
	}
	m := harness.StartMeshca(b, bin, args...)
	w := cluster.NewWorkload(b, cluster.Namespace(b, "bench"), "frontend", "node-a")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	reqs, pems, err := load.Requests([]spiffeid.ID{id}, 64, false)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.root.Cert)
	conns, err := load.Target{Addr: m.Addr, Roots: roots}.DialN(1, w.Token, reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	defer load.CloseAll(conns)
	direct := directClient(b, v.Addr)
	sign := func(i int) (*api.Secret, error) {
		return direct.Logical().WriteWithContext(context.Background(), "pki/sign/"+harness.VaultMainRole, map[string]any{
			"csr": string(pems[i%len(pems)]), "uri_sans": id.String(), "ttl": "86400s", "format": "pem", "exclude_cn_from_sans": true,
		})
	}
	checkOnce(b, conns[0], sign, reqs[0], id)
	meter := &load.Meter{Pids: map[string]int{"vault": v.Pid(), "meshca": m.Pid()}}
	runDirect := func() *load.Sample {
		return load.Sustain(concurrency, func(_, i int) error { _, err := sign(i); return err }, 300*time.Millisecond, 2*time.Second, meter)
	}
	viaMeshca := func(d time.Duration) *load.Sample {
		return load.Sustain(concurrency, func(_, i int) error { return conns[0].Call(reqs[i%len(reqs)]) }, 300*time.Millisecond, d, meter)
	}
	runMeshca := func() *load.Sample { return viaMeshca(2 * time.Second) }
	// Pinned: Vault on a core of its own, meshca and this client on the
	// other, as when meshca and Vault run on machines of their own.
	pinned := func(run func() *load.Sample) *load.Sample {
		if runtime.NumCPU() < 2 {
			return nil
		}
		unpin, err := load.Pin(map[int]string{v.Pid(): "1", m.Pid(): "0", os.Getpid(): "0"})
		if err != nil {
			b.Logf("not pinned: %v", err)
			return nil
		}
		defer unpin()
		return run()
	}
	var d, via, pd, pvia best
	for i := 0; b.Loop(); i++ {
		d.add(b, "direct", runDirect())
		if i == 0 && profile != "" {
			via.add(b, "meshca", profileMeshca(b, profile, m.AdminAddr, viaMeshca))
		} else {
			via.add(b, "meshca", runMeshca())
		}
		pd.add(b, "pinned direct", pinned(runDirect))
		pvia.add(b, "pinned meshca", pinned(runMeshca))
	}
	b.ReportMetric(d.rate, "direct-signs/s")
	b.ReportMetric(via.rate, "meshca-signs/s")
	b.ReportMetric(d.rate/via.rate, "x-direct")
	if pd.rate > 0 && pvia.rate > 0 {
		b.ReportMetric(pd.rate/pvia.rate, "x-direct-pinned")
		b.ReportMetric(float64(pvia.p50)/float64(pd.p50), "x-p50-pinned")
	}
	dTotal, viaTotal := d.cpu["vault"]+d.cpu[load.Self], via.cpu["vault"]+via.cpu["meshca"]+via.cpu[load.Self]
	b.ReportMetric(float64(viaTotal)/float64(dTotal), "x-cpu")
	us := func(t time.Duration) float64 { return float64(t.Nanoseconds()) / 1000 }
	b.ReportMetric(us(d.cpu["vault"]), "vault-µs/direct")
	b.ReportMetric(us(d.cpu[load.Self]), "client-µs/direct")
	b.ReportMetric(us(via.cpu["vault"]), "vault-µs/via")
	b.ReportMetric(us(via.cpu["meshca"]), "meshca-µs/via")
	b.ReportMetric(us(via.cpu[load.Self]), "client-µs/via")
}

// benchConcurrency is the number of clients of BenchmarkVaultOverhead;
// MESHCA_BENCH_CONCURRENCY overrides it.
var benchConcurrency = func() int {
	if n, err := strconv.Atoi(os.Getenv("MESHCA_BENCH_CONCURRENCY")); err == nil && n > 0 {
		return n
	}
	return 8
}()

// best keeps the best of a path's rounds: the highest rate, and the least
// CPU per request of each process.
type best struct {
	rate float64
	p50  time.Duration // of the round with the best rate
	cpu  map[string]time.Duration
}

func (p *best) add(b *testing.B, path string, s *load.Sample) {
	if s == nil {
		return
	}
	if s.Errs > 0 {
		b.Fatalf("%s: %d requests failed, the first: %v", path, s.Errs, s.FirstErr)
	}
	// On standard output: a benchmark's log is cut after ten lines.
	fmt.Printf("%-13s %6.0f/s p50 %5.2f ms, CPU µs/req: vault %4.0f, meshca %4.0f, client %4.0f (load average %s)\n", path, s.Rate(), float64(s.Pct(0.5).Microseconds())/1000,
		float64(s.CPUPerReq("vault").Microseconds()), float64(s.CPUPerReq("meshca").Microseconds()), float64(s.CPUPerReq(load.Self).Microseconds()), load.LoadAvg())
	if s.Rate() > p.rate {
		p.rate, p.p50 = s.Rate(), s.Pct(0.5)
	}
	if p.cpu == nil {
		p.cpu = map[string]time.Duration{}
	}
	for name := range s.CPU {
		if c, ok := p.cpu[name]; !ok || s.CPUPerReq(name) < c {
			p.cpu[name] = s.CPUPerReq(name)
		}
	}
}

// directClient is a Vault client with the root token that keeps a
// connection for every request in flight, as meshca's does (the default
// pool keeps GOMAXPROCS+1).
func directClient(b *testing.B, addr string) *api.Client {
	cfg := api.DefaultConfig()
	cfg.Address = addr
	cfg.MaxRetries = 0
	cfg.HttpClient.Transport.(*http.Transport).MaxIdleConnsPerHost = 100
	c, err := api.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	c.SetToken(harness.VaultRootToken)
	return c
}

// checkOnce checks one reply of each path as the harness checks every
// reply of a test (zlint, X509-SVID), before anything is timed.
func checkOnce(b *testing.B, c *load.Conn, sign func(int) (*api.Secret, error), req *authpb.IstioCertificateRequest, id spiffeid.ID) {
	chain, err := c.Reply(req)
	if err != nil {
		b.Fatal(err)
	}
	harness.CheckReply(b, chain)
	secret, err := sign(0)
	if err != nil {
		b.Fatal(err)
	}
	cert, _ := secret.Data["certificate"].(string)
	certs, err := pemutil.ParseCertificates([]byte(cert))
	if err != nil || len(certs) == 0 || len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != id.String() {
		b.Fatalf("Vault's answer: %v %v", certs, err)
	}
	harness.CheckCertificates(b, certs[0])
}

// profileMeshca runs the meshca path for 6 s while it profiles meshca's
// CPU for 5 s into dir, and prints where the CPU went.
func profileMeshca(b *testing.B, dir, admin string, run func(time.Duration) *load.Sample) *load.Sample {
	file := filepath.Join(dir, "meshca-vault-cpu.pb.gz")
	done := make(chan error, 1)
	go func() {
		time.Sleep(800 * time.Millisecond)
		done <- load.Fetch(admin, "/debug/pprof/profile?seconds=5", file)
	}()
	s := run(6 * time.Second)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	shares, err := load.Breakdown(load.MeshcaCategories, file)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("meshca's CPU under the Vault load (%s):\n", file)
	load.PrintBreakdown(os.Stdout, shares, s.N*5/6)
	return s
}
