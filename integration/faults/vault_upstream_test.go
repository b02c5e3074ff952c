package faults

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// The intermediate of TestVaultUpstreamAway: two minutes, renewed with
// three quarters left (30 s after its issue, a renewer looking every
// 10 s); leaves of a minute (--default-ttl), refused once less than half
// a minute is left. Vault stays away for at least awayOutage, longer than
// a renewal interval, and until a renewal has failed; at most
// awayMaxOutage, which leaves the intermediate more than a minute when
// Vault is back.
const (
	awayTTL       = 2 * time.Minute
	awayRenewAt   = "0.75"
	awayLeafTTL   = time.Minute
	awayOutage    = 35 * time.Second
	awayMaxOutage = 55 * time.Second
)

// TestVaultUpstreamAway runs meshca --upstream vault-pki against the real
// Vault and apiserver under a ztunnel's load, and takes Vault away for
// longer than a renewal interval twice, right after an intermediate was
// issued: sealed, then frozen (SIGSTOP: unreachable, every call hanging
// until its timeout). While Vault is away every request is served with
// the intermediate meshca holds, renewals fail and are counted
// (meshca_intermediate_renewal_failures, the alert's input) and /readyz
// says why; once Vault is back a new intermediate is issued and served
// without a restart.
func TestVaultUpstreamAway(t *testing.T) {
	noLeaks(t)
	began := time.Now()
	m := newMesh(t, 4)
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki")
	token := filepath.Join(t.TempDir(), "vault.token")
	if err := os.WriteFile(token, []byte(harness.VaultRootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state")
	args := append(m.args(requestTimeout), "--kubeconfig", cluster.Kubeconfig, "--state-dir", state,
		"--upstream", "vault-pki", "--vault-addr", v.Addr, "--vault-token-file", token, "--vault-pki-mount", "pki",
		"--intermediate-ttl", awayTTL.String(), "--intermediate-renew-at", awayRenewAt, "--root-lifetime", "48h",
		"--default-ttl", awayLeafTTL.String(), "--max-ttl", awayLeafTTL.String(), "--auto-rotate=false")
	s := harness.StartMeshca(t, bin, args...)
	booted := time.Now()
	roots, _, err := harness.RootBundle(context.Background(), bin, "--state-dir", state)
	if err != nil {
		t.Fatal(err)
	}
	zt := dial(t, load.Target{Addr: s.Addr, Roots: certs.Pool(roots...)}, m.token)
	workload := requests(t, m.ids, 4)
	for _, r := range workload {
		r.ValidityDuration = int64(awayLeafTTL / time.Second)
	}
	first := call(zt, workload[0])
	if !served.matches(first) {
		t.Fatalf("first request: %v", first)
	}
	harness.CheckReply(t, first.reply)
	st := startStream(t, "ztunnel", 2, 20*time.Millisecond, func(i int) outcome { return call(zt, nth(workload, i)) })

	ctx := context.Background()
	for _, away := range []struct {
		name        string
		leave, back func(t *testing.T)
	}{
		{
			name:  "sealed",
			leave: func(t *testing.T) { must(t, v.Client.Sys().SealWithContext(ctx)) },
			back: func(t *testing.T) {
				_, err := v.Client.Sys().UnsealWithContext(ctx, v.UnsealKey(t))
				must(t, err)
			},
		},
		{
			name:  "unreachable",
			leave: func(t *testing.T) { must(t, syscall.Kill(v.Pid(), syscall.SIGSTOP)) },
			back:  func(t *testing.T) { must(t, syscall.Kill(v.Pid(), syscall.SIGCONT)) },
		},
	} {
		inter := intermediateOf(t, st.last(t))
		mark := s.LogMark()
		left := time.Now()
		away.leave(t)
		var failing int
		for time.Since(left) < awayOutage || failing == 0 && time.Since(left) < awayMaxOutage {
			time.Sleep(time.Second)
			failing = failures(t, s.AdminAddr)
		}
		ready := readyz(t, s.AdminAddr)
		during := intermediateOf(t, st.last(t))
		backAt := time.Now()
		away.back(t)
		if !s.WaitForLogAfter(mark, awayTTL, "intermediate renewed") {
			t.Fatalf("Vault %s, then back: no intermediate renewed within %v", away.name, awayTTL)
		}
		renewed := time.Now()
		after := waitNewIntermediate(t, st, inter, 10*time.Second)
		outs := st.within(left, time.Now())
		counts := check(t, "Vault "+away.name, outs, served)
		harness.Report(t, "Vault %s for %v: %d requests served, %v failed; %d renewals failed; renewed %v after Vault was back; /readyz: %s",
			away.name, backAt.Sub(left).Round(time.Second), counts[0], len(outs)-counts[0], failing, renewed.Sub(backAt).Round(100*time.Millisecond), firstLine(ready))
		switch {
		case !during.Equal(inter):
			t.Errorf("Vault %s: the intermediate changed while Vault was away", away.name)
		case after.Equal(inter):
			t.Errorf("Vault %s, then back: leaves still carry the intermediate of before", away.name)
		case failing == 0:
			t.Errorf("Vault %s: meshca_intermediate_renewal_failures stayed 0 though renewals were due", away.name)
		case !strings.Contains(ready, "renewal from upstream vault-pki failing"):
			t.Errorf("Vault %s: /readyz does not say renewals fail:\n%s", away.name, ready)
		}
		if f := failures(t, s.AdminAddr); f != 0 {
			t.Errorf("Vault %s, then back: meshca_intermediate_renewal_failures %d after the renewal, want 0", away.name, f)
		}
	}
	if st := s.Exited(); st != nil {
		t.Fatalf("meshca exited: %v", st)
	}
	harness.Report(t, "test took %v (%v from meshca's start)", time.Since(began).Round(time.Second), time.Since(booted).Round(time.Second))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// last is the stream's latest served outcome.
func (s *stream) last(t *testing.T) outcome {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		outs := s.within(time.Time{}, time.Time{})
		for i := len(outs) - 1; i >= 0; i-- {
			if served.matches(outs[i]) {
				return outs[i]
			}
		}
	}
	t.Fatalf("%s: nothing served", s.name)
	return outcome{}
}

// intermediateOf is the intermediate of a served reply: the second
// certificate of [leaf, intermediate, roots...].
func intermediateOf(t *testing.T, o outcome) *x509.Certificate {
	t.Helper()
	if len(o.reply) < 2 {
		t.Fatalf("reply of %d certificates", len(o.reply))
	}
	c, err := pemutil.ParseCertificates([]byte(o.reply[1]))
	if err != nil || len(c) != 1 {
		t.Fatalf("the reply's intermediate: %v", err)
	}
	return c[0]
}

// waitNewIntermediate waits for a reply carrying another intermediate
// than old, and returns it.
func waitNewIntermediate(t *testing.T, s *stream, old *x509.Certificate, bound time.Duration) *x509.Certificate {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		if c := intermediateOf(t, s.last(t)); !c.Equal(old) || time.Now().After(deadline) {
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var failuresLine = regexp.MustCompile(`(?m)^meshca_intermediate_renewal_failures\{upstream="vault-pki"\} (\d+)`)

// failures is meshca_intermediate_renewal_failures as meshca exports it;
// 0 before the first renewal is tried.
func failures(t *testing.T, admin string) int {
	t.Helper()
	body := get(t, "http://"+admin+"/metrics")
	m := failuresLine.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// readyz is /readyz's answer, with its status.
func readyz(t *testing.T, admin string) string {
	t.Helper()
	return get(t, "http://"+admin+"/readyz?verbose")
}

func get(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	r, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d %s", r.StatusCode, b)
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "upstream") {
			return strings.TrimSpace(l)
		}
	}
	return strings.SplitN(s, "\n", 2)[0]
}
