package signers

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestVaultLogins: AppRole and the Kubernetes auth method (Vault reviewing
// meshca's own service-account token against the real apiserver) log in,
// sign with both roles under the documented policy, and keep working after
// the first token is revoked.
func TestVaultLogins(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "root", testca.Options{})
	v.ConfigurePKI(t, "pki", root.Authority(), harness.VaultRole{})
	ctx := context.Background()
	logical := v.Client.Logical()
	must := func(_ *api.Secret, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	approle := appRoleLogin(t, v, map[string]any{"token_ttl": "1h"})

	// Kubernetes: Vault calls the real apiserver's TokenReview.
	ns := cluster.Namespace(t, "vault-login")
	cluster.ServiceAccount(t, ns, "meshca")
	if err := v.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "kubernetes", &api.EnableAuthOptions{Type: "kubernetes"}); err != nil {
		t.Fatal(err)
	}
	must(logical.Write("auth/kubernetes/config", map[string]any{
		"kubernetes_host": cluster.APIURL, "kubernetes_ca_cert": string(cluster.Config.CAData),
		"token_reviewer_jwt": cluster.AdminToken, "disable_local_ca_jwt": true,
	}))
	must(logical.Write("auth/kubernetes/role/meshca", map[string]any{
		"bound_service_account_names": "meshca", "bound_service_account_namespaces": ns,
		"token_policies": "meshca", "token_ttl": "1h", "audience": "vault",
	}))
	saToken := filepath.Join(t.TempDir(), "sa-token")
	if err := os.WriteFile(saToken, []byte(cluster.Token(t, ns, "meshca", "", []string{"vault"}, time.Hour)), 0o600); err != nil {
		t.Fatal(err)
	}
	k8s, err := vaultauth.Kubernetes("", "meshca", saToken)
	if err != nil {
		t.Fatal(err)
	}

	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for name, auth := range map[string]api.AuthMethod{"approle": approle, "kubernetes": k8s} {
		t.Run(name, func(t *testing.T) {
			s, err := vault.New(vault.Config{
				Address: v.Addr, Mount: "pki", Role: harness.VaultMainRole, KeyEnciphermentRole: harness.VaultRSARole,
				Auth: auth, Timeout: 3 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() { _ = s.Run(rctx) }()
			if _, err := s.Sign(ctx, vaultRequest(t, id)); err != nil {
				t.Fatalf("first sign: %v", err)
			}
			// The documented policy lets the login sign with the RSA role too.
			if _, err := s.Sign(ctx, vaultRequestFor(t, id, rsaKey)); err != nil {
				t.Fatalf("RSA sign: %v", err)
			}
			// Revoke every token this login method issued: the next sign logs in again.
			accessors, err := logical.List("auth/token/accessors")
			if err != nil {
				t.Fatal(err)
			}
			revoked := 0
			for _, a := range accessors.Data["keys"].([]any) {
				info, err := logical.Write("auth/token/lookup-accessor", map[string]any{"accessor": a})
				if path, _ := info.Data["path"].(string); err == nil && strings.HasPrefix(path, "auth/"+name+"/") {
					if _, err := logical.Write("auth/token/revoke-accessor", map[string]any{"accessor": a}); err == nil {
						revoked++
					}
				}
			}
			if revoked == 0 {
				t.Fatal("found no token of this login to revoke")
			}
			if _, err := s.Sign(ctx, vaultRequest(t, id)); err != nil {
				t.Fatalf("after the token was revoked: %v", err)
			}
		})
	}
}
