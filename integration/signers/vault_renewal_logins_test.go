package signers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tokenFileRenewal: meshca reads its token from a file that the test
// rewrites, as Vault Agent's sink would, at the max TTL of the token in it
// plus writeAt: before it (negative), as Agent does, or late.
func tokenFileRenewal(t *testing.T, p *pki, name string, writeAt time.Duration) *renewalRun {
	r := newRenewalRun(t, p, name)
	r.lateBy = max(writeAt, 0)
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
			timer := time.NewTimer(time.Until(issued.Add(renewalMaxTTL + writeAt)))
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
			var err error
			if issued, err = create(ctx); err != nil {
				return err
			}
			r.rewrites = append(r.rewrites, issued)
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
