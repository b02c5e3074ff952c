package faults

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
)

// TestVaultOutage seals Vault under load and unseals it, then stops it and
// starts it again (a dev server comes back empty: its PKI is configured
// again, as an operator restores one), with meshca --signer vault running
// throughout. While Vault is sealed or down every request fails fast with
// Unavailable; once it is back, requests succeed again within a bound,
// without a restart of meshca.
func TestVaultOutage(t *testing.T) {
	noLeaks(t)
	m := newMesh(t, 8)
	p := harness.NewExternalPKI(t)
	v := harness.StartVault(t, vaultBin)
	v.ConfigurePKI(t, "pki", p.Inter.Authority(), harness.VaultRole{})
	p.Write(t, "vault.token", []byte(harness.VaultRootToken))
	args := append(m.args(requestTimeout), "--signer", "vault", "--kubeconfig", cluster.Kubeconfig, "--vault-addr", v.Addr,
		"--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole, "--vault-token-file", p.Path("vault.token"))
	s := harness.StartMeshca(t, bin, append(args, p.ServingArgs()...)...)
	roots := x509.NewCertPool()
	roots.AddCert(p.Root.Cert)
	zt := dial(t, load.Target{Addr: s.Addr, Roots: roots}, m.token)
	workload := requests(t, m.ids, 4)
	warm := call(zt, workload[0])
	if !served.matches(warm) {
		t.Fatalf("first request: %v", warm)
	}
	harness.CheckReply(t, warm.reply)
	st := startStream(t, "reviewed token", 2, 20*time.Millisecond, func(i int) outcome { return call(zt, nth(workload, i)) })
	time.Sleep(500 * time.Millisecond)

	ctx := context.Background()
	for _, f := range []struct {
		name  string
		fail  func(t *testing.T)
		heal  func(t *testing.T)
		while want
		// healing is what a request may get while heal runs, besides
		// served and while.
		healing []want
	}{
		{
			name: "sealed",
			fail: func(t *testing.T) {
				if err := v.Client.Sys().SealWithContext(ctx); err != nil {
					t.Fatal(err)
				}
			},
			heal: func(t *testing.T) {
				if _, err := v.Client.Sys().UnsealWithContext(ctx, v.UnsealKey(t)); err != nil {
					t.Fatal(err)
				}
			},
			while: signerDown,
		},
		{
			name: "stopped",
			fail: func(*testing.T) { v.Stop() },
			heal: func(t *testing.T) {
				v.Start(t)
				v.ConfigurePKI(t, "pki", p.Inter.Authority(), harness.VaultRole{})
			},
			while: signerDown,
			// Started, not yet configured: no PKI mount, no roles.
			healing: []want{signerRefused},
		},
	} {
		failing := time.Now()
		f.fail(t)
		failed := time.Now()
		time.Sleep(2 * time.Second)
		healing := time.Now()
		f.heal(t)
		healed := time.Now()
		back := st.waitFor(t, healed, served, 20*time.Second)
		time.Sleep(500 * time.Millisecond)
		done := time.Now()

		bound := requestTimeout + margin
		for _, w := range []struct {
			when     string
			from, to time.Time
			wants    []want
		}{
			{"failing", failing, failed, []want{served, f.while}},
			{"failed", failed, healing, []want{f.while}},
			{"healing", healing, healed, append([]want{served, f.while}, f.healing...)},
			{"healed", healed, back.start, []want{served, f.while}},
			{"served again", back.start, done, []want{served}},
		} {
			what := "Vault " + f.name + ", " + w.when
			outs := st.within(w.from, w.to)
			counts := check(t, what, outs, w.wants...)
			p99, slowest := failFast(t, what, outs, bound)
			t.Logf("%s: %d answers, %v of %v; failures p99 %v, slowest %v", what, len(outs), counts, w.wants,
				p99.Round(time.Millisecond), slowest.Round(time.Millisecond))
		}
		if n := len(st.within(failed, healing)); n < 5 {
			t.Errorf("%s: only %d requests while Vault was %s", f.name, n, f.name)
		}
		harness.Report(t, "%s: failed in %v, healed in %v, served again %v after", f.name, failed.Sub(failing).Round(time.Millisecond),
			healed.Sub(healing).Round(time.Millisecond), back.end.Sub(healed).Round(time.Millisecond))
	}
	if st := s.Exited(); st != nil {
		t.Fatalf("meshca exited: %v", st)
	}
}
