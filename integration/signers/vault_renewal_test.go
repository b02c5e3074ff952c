package signers

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
)

// The tokens of every login under test are renewable, live renewalTTL
// unless renewed, and renewalMaxTTL at most however often they are.
const (
	renewalTTL    = 10 * time.Second
	renewalMaxTTL = 40 * time.Second
	// sinkLead is how long before its token's max TTL the test, as Vault
	// Agent's file sink, writes a fresh token into meshca's token file:
	// Agent logs in again when its own renewals give up, which they do
	// (Vault's LifetimeWatcher, as meshca's) with 10-20% of the TTL left
	// at the latest, or earlier when the next renewal would leave less.
	sinkLead = 5 * time.Second
	// sinkLate is how long after its token's max TTL a late sink writes
	// the next one.
	sinkLate = 5 * time.Second
	// issueEvery paces each meshca's certificate requests.
	issueEvery = 100 * time.Millisecond
	// renewalDeadline bounds a run: a second token renewed once comes
	// about renewalMaxTTL plus two thirds of renewalTTL after the first.
	renewalDeadline = 2*renewalMaxTTL + renewalTTL
)

// loginSettings are the token settings of every login's role.
var loginSettings = map[string]any{"token_ttl": renewalTTL.String(), "token_max_ttl": renewalMaxTTL.String()}

// TestVaultTokenRenewal runs `meshca serve --signer vault` against the
// real Vault with each login, through its flags (a token file rewritten as
// Vault Agent's sink does; AppRole; Vault's Kubernetes auth method
// reviewing meshca's service-account token with the real apiserver, the
// token file replaced as the kubelet does), side by side, each asked for
// a certificate every issueEvery, until meshca's second Vault token has
// been renewed. Vault's audit log shows what meshca did with its tokens:
// the first is renewed past its TTL (renewalTTL) until its max TTL, then
// meshca logs in again (with the credential its files hold then) and
// renews the new token; no certificate request fails, and Vault refuses
// nothing. A token file written sinkLate after its token's max TTL shows
// the one gap no login can bridge: requests fail from the old token's
// expiry until the file holds a new one, and no longer.
func TestVaultTokenRenewal(t *testing.T) {
	p := newPKI(t)
	runs := []*renewalRun{
		tokenFileRenewal(t, p, "token file", -sinkLead),
		appRoleRenewal(t, p),
		kubernetesRenewal(t, p),
		tokenFileRenewal(t, p, "token file written late", sinkLate),
	}
	for _, r := range runs {
		r.start(t, p)
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(t)
		}()
	}
	wg.Wait()
	for _, r := range runs {
		t.Run(r.name, r.check)
	}
}

// renewalRun is one login's meshca under a steady stream of requests.
type renewalRun struct {
	name  string
	args  []string // meshca's login flags
	vault *harness.Vault
	audit *vaultAudit
	// rewrite, when set, replaces a credential file meshca reads, until
	// ctx ends: a token file as Vault Agent's sink does, a service-account
	// token as the kubelet does. rewrites are when it wrote a token file.
	rewrite  func(ctx context.Context) error
	rewrites []time.Time
	// lateBy is how long after its max TTL the token file gets the next
	// token: 0 unless the sink is late.
	lateBy time.Duration
	// prestart, when set, readies the login just before meshca starts.
	prestart func(t *testing.T)
	// verify, when set, checks what only this login shows.
	verify func(t *testing.T)

	m       *harness.Meshca
	started time.Time // when meshca was ready: its first login
	client  *checked.Client
	id      spiffeid.ID

	issued     *issued
	gauges     *loginGauges
	audited    auditView
	took       time.Duration
	err        error
	rewriteErr error
}

// newRenewalRun starts a Vault for one login: the PKI mount and roles of
// docs/signers/vault.md issuing under p's intermediate, meshca's policy,
// and the audit device.
func newRenewalRun(t *testing.T, p *pki, name string) *renewalRun {
	t.Helper()
	v := harness.StartVault(t, vaultBin)
	v.ConfigurePKI(t, "pki", p.inter.Authority(), harness.VaultRole{})
	if err := v.Client.Sys().PutPolicyWithContext(context.Background(), "meshca", meshcaPolicy); err != nil {
		t.Fatal(err)
	}
	return &renewalRun{name: name, vault: v, audit: enableAudit(t, v)}
}

// start runs meshca with the run's login, and readies a workload that
// asks it for certificates.
func (r *renewalRun) start(t *testing.T, p *pki) {
	t.Helper()
	if r.prestart != nil {
		r.prestart(t)
	}
	args := slices.Concat([]string{"--signer", "vault", "--kubeconfig", cluster.Kubeconfig,
		"--vault-addr", r.vault.Addr, "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole}, r.args, p.ServingArgs())
	r.m = harness.StartMeshca(t, bin, args...)
	r.started = time.Now()
	w := cluster.NewWorkload(t, cluster.Namespace(t, "renewal"), "app", "node-a")
	r.id = spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	roots := x509.NewCertPool()
	roots.AddCert(p.root.Cert)
	c, err := checked.NewClient(t, caclient.Config{Addr: r.m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots,
		TokenFile: harness.WriteToken(t, w.Token)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r.client = c
}

// run issues certificates and samples meshca's login gauges until Vault's
// audit log shows meshca's second token renewed, or renewalDeadline.
func (r *renewalRun) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.issued = issueSteadily(ctx, t, r.client, r.id, issueEvery) }()
	go func() { defer wg.Done(); r.gauges = sampleLogin(ctx, r.m.AdminAddr, 250*time.Millisecond) }()
	if r.rewrite != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.rewriteErr = r.rewrite(ctx) }()
	}
	start := time.Now()
	for {
		time.Sleep(500 * time.Millisecond)
		view, err := r.audit.read()
		if err != nil {
			r.err = err
			break
		}
		// A token is renewed as soon as meshca takes it up (Vault's
		// LifetimeWatcher renews first), and again at two thirds of its
		// TTL.
		if n := len(view.tokens); n >= 2 && len(view.tokens[n-1].renewals) >= 2 {
			break
		}
		if time.Since(start) > renewalDeadline {
			r.err = fmt.Errorf("after %v meshca had logged in with %d tokens; want a second one, renewed", renewalDeadline, len(view.tokens))
			break
		}
	}
	r.took = time.Since(start)
	cancel()
	wg.Wait()
	if view, err := r.audit.read(); err != nil {
		r.err = err
	} else {
		r.audited = view
	}
}

// check judges a run from Vault's audit log, meshca's requests, metrics
// and log, and reports the figures.
func (r *renewalRun) check(t *testing.T) {
	defer func() {
		harness.Report(t, "%s in %.0fs; Vault's audit log: %s, %d logins refused; meshca: %s",
			r.issued, r.took.Seconds(), tokenReport(r.audited.tokens), r.audited.failedLogins, r.gauges)
	}()
	if r.err != nil || r.rewriteErr != nil {
		t.Fatalf("run: %v; rewriting the credential file: %v", r.err, r.rewriteErr)
	}
	tokens := r.audited.tokens
	if len(tokens) < 2 {
		t.Fatalf("meshca logged in with %d tokens, want 2", len(tokens))
	}
	first := tokens[0]
	// Renewed past its TTL, used until close to its max TTL, never past
	// (but for the second Vault may round its last grant up to).
	if lived := first.last.Sub(first.issued); len(first.renewals) < 3 {
		t.Errorf("first token renewed %d times in %v, want 3 or more (a renewal about every two thirds of its %v TTL)", len(first.renewals), lived, renewalTTL)
	} else if lived < renewalMaxTTL-renewalTTL || lived > renewalMaxTTL+time.Second {
		t.Errorf("first token signed until %v after its issue, want between %v and its max TTL %v", lived, renewalMaxTTL-renewalTTL, renewalMaxTTL)
	}
	if strings.Contains(r.m.Logs(), "hvs.") {
		t.Error("a Vault token reached meshca's log")
	}
	if r.lateBy > 0 {
		r.checkGap(t, first.issued.Add(renewalMaxTTL))
	} else {
		r.checkSteady(t)
	}
	if r.verify != nil {
		r.verify(t)
	}
}

// checkSteady: meshca logged in again near the first token's max TTL,
// nothing failed and Vault refused nothing.
func (r *renewalRun) checkSteady(t *testing.T) {
	if n := len(r.issued.failed()); n > 0 {
		t.Errorf("%d certificate requests failed: %s", n, r.issued.failureList(10))
	}
	tokens := r.audited.tokens
	if first, second := tokens[0], tokens[1]; second.loggedIn.Before(first.issued.Add(renewalMaxTTL - renewalTTL)) {
		t.Errorf("meshca logged in again %v after its first token's issue, before its max TTL (%v) was near", second.loggedIn.Sub(first.issued), renewalMaxTTL)
	}
	if r.audited.failedLogins > 0 {
		t.Errorf("Vault refused %d of meshca's logins", r.audited.failedLogins)
	}
	for i, u := range tokens {
		if u.refused > 0 || u.refusedRenewals > 0 {
			t.Errorf("token %d: Vault refused %d signatures and %d renewals", i+1, u.refused, u.refusedRenewals)
		}
	}
	// Without renewals the TTL gauge would reach 0 after renewalTTL; each
	// renewal raises it, one about every two thirds of renewalTTL, so at
	// least 4 before the first token's max TTL; meshca logs in again
	// before it gives a token up, so it is never logged out.
	if g := r.gauges; g.samples == 0 || g.loggedOut > 0 || g.minTTL <= 0 || g.maxTTL > renewalTTL.Seconds() || g.rises < 4 {
		t.Errorf("meshca's login gauges: %s; want logged in with time left in every sample, never more than %v, rising 4 times or more", g, renewalTTL)
	}
	if n := strings.Count(r.m.Logs(), "vault login or renewal failed"); n > 0 {
		t.Errorf("meshca logged %d failed logins or renewals:\n%s", n, r.m.Logs())
	}
}

// checkGap: with the token file written late, requests fail only from
// the old token's expiry until the new token is in the file (with a
// second of slack each side, for a request under way), each with
// FailedPrecondition, and the first request after the file is written
// gets its certificate.
func (r *renewalRun) checkGap(t *testing.T, expired time.Time) {
	if len(r.rewrites) == 0 {
		t.Fatal("the late token was never written")
	}
	written := r.rewrites[0]
	from, to := expired.Add(-time.Second), written.Add(time.Second)
	for _, f := range r.issued.failed() {
		if f.code != codes.FailedPrecondition || f.start.Before(from) || f.end.After(to) {
			t.Errorf("request sent %v after the old token's expiry failed with %s: %s; want FailedPrecondition, and only between its expiry and the new token's write (%v after it)",
				f.start.Sub(expired).Round(time.Millisecond), f.code, f.err, written.Sub(expired).Round(time.Millisecond))
		}
	}
	// meshca kept renewing the old token, and taking it up again, until
	// its end: a renewal a second at most once Vault refuses them, the
	// TTL it reports never longer than Vault's, and the failing logins in
	// its log.
	if refused := r.audited.tokens[0].refusedRenewals; refused > int(renewalTTL/time.Second) {
		t.Errorf("Vault refused %d renewals of the old token, want a renewal a second at most", refused)
	}
	if g := r.gauges; g.maxTTL > renewalTTL.Seconds() {
		t.Errorf("meshca's login gauges: %s; want a TTL of %v at most", g, renewalTTL)
	}
	if !strings.Contains(r.m.Logs(), "vault login or renewal failed") {
		t.Error("meshca's log does not say that its Vault login fails")
	}
	next, ok := r.issued.firstOKAfter(written)
	if !ok {
		t.Fatal("no certificate after the new token's write")
	}
	if next.Sub(written) > time.Second {
		t.Errorf("the first certificate after the new token's write came %v after it, want within a second", next.Sub(written))
	}
	harness.Report(t, "token file written %v after its token's max TTL: %d requests failed, %s; the first certificate after the write %v after it",
		written.Sub(expired).Round(time.Millisecond), len(r.issued.failed()), r.issued.failureSpan(expired), next.Sub(written).Round(time.Millisecond))
}

// tokenReport describes each token meshca used.
func tokenReport(tokens []tokenUse) string {
	var parts []string
	for i, u := range tokens {
		parts = append(parts, fmt.Sprintf("token %d %s", i+1, u.summary()))
		if i > 0 {
			parts[i] += fmt.Sprintf(", logged in %.1fs after token %d's issue", u.loggedIn.Sub(tokens[i-1].issued).Seconds(), i)
		}
	}
	return strings.Join(parts, "; ")
}
