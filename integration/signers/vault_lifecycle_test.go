package signers

import (
	"context"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestVaultTokenExpiryAndSeal: an AppRole token that expires is replaced by
// a fresh login without a restart; a sealed Vault is Unavailable, and
// signing resumes once it is unsealed.
func TestVaultTokenExpiryAndSeal(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "root", testca.Options{})
	v.ConfigurePKI(t, "pki", root.Authority(), harness.VaultRole{})
	ctx := context.Background()
	// Tokens that live three seconds and cannot be renewed past that.
	auth := appRoleLogin(t, v, map[string]any{"token_ttl": "3s", "token_max_ttl": "3s"})
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
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	for i := range 3 {
		if _, err := s.Sign(ctx, vaultRequest(t, id)); err != nil {
			t.Fatalf("sign %d: %v", i, err)
		}
		time.Sleep(4 * time.Second) // past the token's life
	}

	if err := v.Client.Sys().SealWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = s.Sign(ctx, vaultRequest(t, id))
	wantKind(t, err, signer.KindUnavailable, "")
	if _, err := v.Client.Sys().UnsealWithContext(ctx, v.UnsealKey(t)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := s.Sign(ctx, vaultRequest(t, id)); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("no recovery after unseal: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
