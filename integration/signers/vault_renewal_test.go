package signers

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// nothing.
func TestVaultTokenRenewal(t *testing.T) {
	p := newPKI(t)
	runs := []*renewalRun{
		tokenFileRenewal(t, p),
		appRoleRenewal(t, p),
		kubernetesRenewal(t, p),
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
	// token as the kubelet does.
	rewrite func(ctx context.Context) error
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

// tokenFileRenewal: meshca reads its token from a file that the test
// rewrites, as Vault Agent's sink would, sinkLead before the token in it
// reaches its max TTL.
func tokenFileRenewal(t *testing.T, p *pki) *renewalRun {
	r := newRenewalRun(t, p, "token file")
	file := filepath.Join(t.TempDir(), "vault-token")
	create := func(ctx context.Context) (time.Time, error) {
		renewable := true
		s, err := r.vault.Client.Auth().Token().CreateWithContext(ctx, &api.TokenCreateRequest{
			Policies: []string{"meshca"}, TTL: renewalTTL.String(), ExplicitMaxTTL: renewalMaxTTL.String(),
			Renewable: &renewable, NoParent: true, DisplayName: "meshca",
		})
		if err != nil {
			return time.Time{}, err
		}
		at := time.Now()
		// Written whole, as a sink does: a file beside it, renamed.
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s.Auth.ClientToken+"\n"), 0o600); err != nil {
			return time.Time{}, err
		}
		return at, os.Rename(tmp, file)
	}
	var issued time.Time
	// The first token, just before meshca starts: nothing renews it
	// until then.
	r.prestart = func(t *testing.T) {
		var err error
		if issued, err = create(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	r.rewrite = func(ctx context.Context) error {
		for {
			timer := time.NewTimer(time.Until(issued.Add(renewalMaxTTL - sinkLead)))
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
			var err error
			if issued, err = create(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
	r.args = []string{"--vault-token-file", file}
	return r
}

// appRoleRenewal: meshca logs in with --vault-approle-role-id and
// --vault-approle-secret-id-file.
func appRoleRenewal(t *testing.T, p *pki) *renewalRun {
	r := newRenewalRun(t, p, "approle")
	roleID, secretIDFile := appRoleCredentials(t, r.vault, loginSettings)
	r.args = []string{"--vault-approle-role-id", roleID, "--vault-approle-secret-id-file", secretIDFile}
	return r
}

// kubernetesRenewal: meshca logs in with --vault-kubernetes-role and
// --vault-kubernetes-token-file, a service-account token of the real
// apiserver, which Vault reviews there with a reviewer's token (a
// service account granted system:auth-delegator, as Vault's docs set it
// up).
func kubernetesRenewal(t *testing.T, p *pki) *renewalRun {
	r := newRenewalRun(t, p, "kubernetes")
	ctx := context.Background()
	ns := cluster.Namespace(t, "vault-renewal")
	cluster.ServiceAccount(t, ns, "meshca")
	cluster.ServiceAccount(t, ns, "vault-reviewer")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-vault-reviewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "vault-reviewer"}}}
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	if err := r.vault.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "kubernetes", &api.EnableAuthOptions{Type: "kubernetes"}); err != nil {
		t.Fatal(err)
	}
	logical := r.vault.Client.Logical()
	if _, err := logical.WriteWithContext(ctx, "auth/kubernetes/config", map[string]any{
		"kubernetes_host": cluster.APIURL, "kubernetes_ca_cert": string(cluster.Config.CAData),
		"token_reviewer_jwt": cluster.Token(t, ns, "vault-reviewer", "", nil, time.Hour), "disable_local_ca_jwt": true,
	}); err != nil {
		t.Fatal(err)
	}
	role := map[string]any{"bound_service_account_names": "meshca", "bound_service_account_namespaces": ns,
		"token_policies": "meshca", "audience": "vault"}
	for k, v := range loginSettings {
		role[k] = v
	}
	if _, err := logical.WriteWithContext(ctx, "auth/kubernetes/role/meshca", role); err != nil {
		t.Fatal(err)
	}
	// meshca's service-account token, and the one the kubelet replaces it
	// with (at 80% of its life; here, half way to the max TTL of meshca's
	// first Vault token, so that meshca's next login must send it).
	jwts := []string{
		cluster.Token(t, ns, "meshca", "", []string{"vault"}, time.Hour),
		cluster.Token(t, ns, "meshca", "", []string{"vault"}, time.Hour),
	}
	saToken := harness.WriteToken(t, jwts[0])
	r.rewrite = func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(r.started.Add(renewalMaxTTL / 2))):
		}
		tmp := saToken + ".tmp"
		if err := os.WriteFile(tmp, []byte(jwts[1]), 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, saToken)
	}
	r.verify = func(t *testing.T) { r.verifyJWTs(t, jwts) }
	r.args = []string{"--vault-kubernetes-role", "meshca", "--vault-kubernetes-token-file", saToken}
	return r
}

// verifyJWTs checks, from Vault's audit log, that each of meshca's
// Kubernetes logins sent the service-account token its file held then:
// the first, and the kubelet's replacement after.
func (r *renewalRun) verifyJWTs(t *testing.T, jwts []string) {
	t.Helper()
	hashes := make([]string, len(jwts))
	for i, jwt := range jwts {
		h, err := r.vault.Client.Sys().AuditHashWithContext(context.Background(), "file", jwt)
		if err != nil {
			t.Fatal(err)
		}
		hashes[i] = h
	}
	var sent []string
	for i, u := range r.audited.tokens {
		want := min(i, len(jwts)-1)
		got := slices.Index(hashes, u.jwt)
		sent = append(sent, fmt.Sprint(got+1))
		if got != want {
			t.Errorf("meshca's login %d sent service-account token %d (0: neither), want %d, the one its file held then", i+1, got+1, want+1)
		}
	}
	harness.Report(t, "meshca's Kubernetes logins sent service-account tokens %s; the kubelet's stand-in replaced token 1 with token 2 %v after meshca started",
		strings.Join(sent, ", "), renewalMaxTTL/2)
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
	if n := len(r.issued.failures); n > 0 {
		t.Errorf("%d certificate requests failed: %s", n, strings.Join(r.issued.failures[:min(n, 10)], "; "))
	}
	tokens := r.audited.tokens
	if len(tokens) < 2 {
		t.Fatalf("meshca logged in with %d tokens, want 2", len(tokens))
	}
	first, second := tokens[0], tokens[1]
	// Renewed past its TTL, used until close to its max TTL, never past.
	switch lived := first.last.Sub(first.issued); {
	case len(first.renewals) < 3:
		t.Errorf("first token renewed %d times in %v, want 3 or more (a renewal about every two thirds of its %v TTL)", len(first.renewals), lived, renewalTTL)
	case lived < renewalMaxTTL-renewalTTL || lived > renewalMaxTTL:
		t.Errorf("first token signed until %v after its issue, want between %v and its max TTL %v", lived, renewalMaxTTL-renewalTTL, renewalMaxTTL)
	case second.loggedIn.Before(first.issued.Add(renewalMaxTTL - renewalTTL)):
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
	// least 4 before the first token's max TTL. (meshca_vault_logged_in
	// is 0 while a re-login is under way, for milliseconds: reported, not
	// judged.)
	if g := r.gauges; g.samples == 0 || g.minTTL <= 0 || g.maxTTL > renewalTTL.Seconds() || g.rises < 4 {
		t.Errorf("meshca's login gauges: %s; want time left in every sample, never more than %v, rising 4 times or more", g, renewalTTL)
	}
	logs := r.m.Logs()
	if n := strings.Count(logs, "vault login or renewal failed"); n > 0 {
		t.Errorf("meshca logged %d failed logins or renewals:\n%s", n, logs)
	}
	if strings.Contains(logs, "hvs.") {
		t.Error("a Vault token reached meshca's log")
	}
	if r.verify != nil {
		r.verify(t)
	}
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
