package signers

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	"github.com/meshca/meshca/keymgr/certs"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkVaultUpstream issues the same CSRs at the same concurrency, in
// one run, through four meshcas against the real apiserver and Vault:
// the built-in CA (its own root signing in process); the built-in CA
// whose intermediate the self upstream renews (the next one's chain
// without Vault: what an intermediate itself costs); the built-in CA
// whose intermediate the vault-pki upstream renews (signing in process
// too; Vault holds the root); and the per-leaf Vault backend (--signer
// vault, pki/sign/<role> for every certificate). They run in turn every
// round, each round starting with the next (-benchtime Nx: N rounds; the
// best round of each counts).
//
// x-builtin is each one's time over the built-in CA's (goal for the
// vault-pki upstream: at most 1.05); meshca-µs/req meshca's CPU per
// request; vault-req/10k Vault's requests per 10,000 certificates, counted by
// Vault's own file audit device over the measured window (the upstream:
// 0, its intermediate lasting the run; per leaf: 10,000). The audit
// device costs Vault some CPU per request, so the per-leaf rate here is
// below BenchmarkVaultOverhead's.
func BenchmarkVaultUpstream(b *testing.B) {
	p := newPKI(b)
	v := harness.StartVault(b, vaultBin)
	v.ConfigurePKI(b, "pki", p.inter.Authority(), harness.VaultRole{})
	v.MountPKI(b, "pki-up")
	p.write(b, "vault.token", []byte(harness.VaultRootToken))
	audit := v.EnableAudit(b)
	common := append([]string{"--kubeconfig", cluster.Kubeconfig, "--audit-log-file", filepath.Join(b.TempDir(), "audit.log")}, load.Unlimited(bin)...)
	vaultLogin := []string{"--vault-addr", v.Addr, "--vault-token-file", p.path("vault.token")}
	builtinState, upstreamState := filepath.Join(b.TempDir(), "builtin"), filepath.Join(b.TempDir(), "upstream")
	selfState := filepath.Join(b.TempDir(), "self")
	paths := []*benchPath{
		{name: "builtin", args: []string{"--state-dir", builtinState}, state: builtinState},
		{name: "self", args: []string{"--state-dir", selfState, "--upstream", "self"}, state: selfState},
		{name: "vault-pki", args: append([]string{"--state-dir", upstreamState, "--upstream", "vault-pki", "--vault-pki-mount", "pki-up"}, vaultLogin...), state: upstreamState},
		{name: "per-leaf", args: append([]string{"--signer", "vault", "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole,
			"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem")}, vaultLogin...)},
	}
	w := cluster.NewWorkload(b, cluster.Namespace(b, "bench-upstream"), "frontend", "node-a")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	reqs, _, err := load.Requests([]spiffeid.ID{id}, 64, false)
	if err != nil {
		b.Fatal(err)
	}
	for _, bp := range paths {
		bp.start(b, append(bp.args, common...), p, w.Token, reqs, v.Pid())
	}
	for round := 0; b.Loop(); round++ {
		// Each round starts with another path, so that none is always
		// measured right after the most CPU-hungry one.
		for k := range paths {
			bp := paths[(round+k)%len(paths)]
			mark := audit.Mark()
			s, issued := bp.run(reqs)
			bp.add(b, s)
			counts, err := audit.Requests(mark)
			if err != nil {
				b.Fatal(err)
			}
			bp.vaultReqs(issued, counts)
		}
	}
	base := paths[0]
	for _, bp := range paths {
		b.ReportMetric(bp.best.rate, bp.name+"-signs/s")
		b.ReportMetric(float64(bp.best.cpu["meshca"].Nanoseconds())/1000, bp.name+"-meshca-µs/req")
		if bp != base {
			b.ReportMetric(base.best.rate/bp.best.rate, bp.name+"-x-builtin")
			b.ReportMetric(bp.perTenK, bp.name+"-vault-req/10k")
		}
	}
}

// benchPath is one meshca of BenchmarkVaultUpstream and its best round.
type benchPath struct {
	name, state string
	args        []string
	m           *harness.Meshca
	conn        *load.Conn
	meter       *load.Meter
	best        best
	// perTenK is Vault's requests per 10,000 certificates over the
	// rounds: vault counts them by path, certs the certificates issued
	// meanwhile (the warm-up's too).
	perTenK float64
	certs   int
	vault   map[string]int
}

// start runs the meshca and connects to it; a state's roots come from
// the state, the per-leaf backend's from the pinned anchors.
func (bp *benchPath) start(b *testing.B, args []string, p *pki, token string, reqs []*authpb.IstioCertificateRequest, vaultPid int) {
	b.Helper()
	bp.m = harness.StartMeshca(b, bin, args...)
	target := load.Target{Addr: bp.m.Addr, Roots: certs.Pool(p.root.Cert)}
	if bp.state != "" {
		roots, _, err := harness.RootBundle(context.Background(), bin, "--state-dir", bp.state)
		if err != nil {
			b.Fatal(err)
		}
		target.Roots = certs.Pool(roots...)
	}
	conns, err := target.DialN(1, token, reqs[0])
	if err != nil {
		b.Fatalf("%s: %v", bp.name, err)
	}
	b.Cleanup(func() { load.CloseAll(conns) })
	bp.conn = conns[0]
	chain, err := bp.conn.Reply(reqs[0])
	if err != nil {
		b.Fatalf("%s: %v", bp.name, err)
	}
	harness.CheckReply(b, chain)
	bp.meter = &load.Meter{Pids: map[string]int{"meshca": bp.m.Pid(), "vault": vaultPid}}
}

// run is one round, and every certificate issued in it.
func (bp *benchPath) run(reqs []*authpb.IstioCertificateRequest) (*load.Sample, int) {
	var issued atomic.Int64
	s := load.Sustain(benchConcurrency, func(_, i int) error {
		err := bp.conn.Call(reqs[i%len(reqs)])
		if err == nil {
			issued.Add(1)
		}
		return err
	}, 300*time.Millisecond, 2*time.Second, bp.meter)
	return s, int(issued.Load())
}

func (bp *benchPath) add(b *testing.B, s *load.Sample) { bp.best.add(b, bp.name, s) }

// vaultReqs adds a round's certificates and Vault's requests, by path.
func (bp *benchPath) vaultReqs(n int, byPath map[string]int) {
	if bp.vault == nil {
		bp.vault = map[string]int{}
	}
	total := 0
	for path, c := range byPath {
		bp.vault[path] += c
		total += c
	}
	bp.certs += n
	bp.perTenK = float64(sumValues(bp.vault)) * 10000 / float64(max(bp.certs, 1))
	var top []string
	for path, c := range byPath {
		top = append(top, fmt.Sprintf("%s %d", path, c))
	}
	fmt.Printf("%-13s %d certificates, Vault requests %d: %s\n", bp.name, n, total, strings.Join(top, ", "))
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
