package signers

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var mounts atomic.Int64

// newVaultSigner configures a fresh PKI mount for a and returns a signer
// with its two roles, logged in with a token file, its Run loop going. Its
// re-login backoff is short, so that a test's second forced login (after a
// Vault restart, say) comes within seconds, not DefaultReloginBackoff.
func newVaultSigner(tb testing.TB, v *harness.Vault, a *keymgr.Authority, role harness.VaultRole, token string) (*vault.Signer, string, string) {
	tb.Helper()
	mount := fmt.Sprintf("pki%d", mounts.Add(1))
	v.ConfigurePKI(tb, mount, a, role)
	tokenFile := filepath.Join(tb.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		tb.Fatal(err)
	}
	s, err := vault.New(vault.Config{
		Address: v.Addr, Mount: mount, Role: harness.VaultMainRole, KeyEnciphermentRole: harness.VaultRSARole, DNSRole: harness.VaultIstiodRole,
		Auth: vaultauth.TokenFile{Path: tokenFile}, Timeout: 3 * time.Second, ReloginBackoff: 2 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	go func() { _ = s.Run(ctx) }()
	return s, tokenFile, mount
}

func TestVaultContract(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	signertest.Run(t, signertest.Backend{
		DNS: true,
		New: func(tb testing.TB, a *keymgr.Authority) signer.Signer {
			s, _, _ := newVaultSigner(tb, v, a, harness.VaultRole{}, harness.VaultRootToken)
			return harness.LintedSigner(tb, a, s)
		},
	})
}

// vaultRequest is a request for id with a fresh P-256 key.
func vaultRequest(t *testing.T, id spiffeid.ID) *signer.Request {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return vaultRequestFor(t, id, key)
}

// vaultRequestFor is a request for id with key.
func vaultRequestFor(t *testing.T, id spiffeid.ID, key crypto.Signer) *signer.Request {
	t.Helper()
	p, _ := csr.Build(key, id)
	parsed, err := csr.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	return &signer.Request{CSR: parsed, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(parsed.PublicKey)}
}

func wantKind(t *testing.T, err error, kind signer.Kind, fragment string) {
	t.Helper()
	var se *signer.Error
	if !errors.As(err, &se) || se.Kind != kind || !strings.Contains(err.Error(), fragment) {
		t.Fatalf("err = %v, want kind %s containing %q", err, kind, fragment)
	}
}

func TestVaultRefusals(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "root", testca.Options{})
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	t.Run("role forbids the URI", func(t *testing.T) {
		s, _, _ := newVaultSigner(t, v, root.Authority(), harness.VaultRole{AllowedURISANs: "spiffe://other.domain/*"}, harness.VaultRootToken)
		_, err := s.Sign(context.Background(), vaultRequest(t, id))
		wantKind(t, err, signer.KindRefused, "URI")
	})
	t.Run("role adds key encipherment to an EC key", func(t *testing.T) {
		s, _, _ := newVaultSigner(t, v, root.Authority(), harness.VaultRole{KeyUsage: "DigitalSignature,KeyEncipherment"}, harness.VaultRootToken)
		_, err := s.Sign(context.Background(), vaultRequest(t, id))
		wantKind(t, err, signer.KindRefused, "goes beyond the allowed")
	})
	t.Run("RSA key without an RSA role", func(t *testing.T) {
		_, tokenFile, mount := newVaultSigner(t, v, root.Authority(), harness.VaultRole{}, harness.VaultRootToken)
		s, err := vault.New(vault.Config{Address: v.Addr, Mount: mount, Role: harness.VaultMainRole, Auth: vaultauth.TokenFile{Path: tokenFile}, Timeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Sign(context.Background(), vaultRequestFor(t, id, key))
		wantKind(t, err, signer.KindRefused, `lacks key usage ["key encipherment"]`)
		wantKind(t, err, signer.KindRefused, "--vault-rsa-role")
	})
	t.Run("bad token", func(t *testing.T) {
		s, _, _ := newVaultSigner(t, v, root.Authority(), harness.VaultRole{}, "not-a-token")
		_, err := s.Sign(context.Background(), vaultRequest(t, id))
		wantKind(t, err, signer.KindRefused, "login")
	})
}

// TestVaultRecovery: Vault goes away mid-run (Unavailable within the
// deadline), its token is revoked (a fresh login), and meshca's signer
// recovers from both without a restart.
func TestVaultRecovery(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "root", testca.Options{})
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	// A child token that can be revoked, written where the signer reads it.
	child, err := v.Client.Auth().Token().Create(&api.TokenCreateRequest{TTL: "1h", Policies: []string{"root"}})
	if err != nil {
		t.Fatal(err)
	}
	s, tokenFile, mount := newVaultSigner(t, v, root.Authority(), harness.VaultRole{}, child.Auth.ClientToken)
	if _, err := s.Sign(context.Background(), vaultRequest(t, id)); err != nil {
		t.Fatal(err)
	}

	// The token is revoked; the file now holds a new one (as Vault Agent
	// would write it): the signer logs in again on the refusal.
	if err := v.Client.Auth().Token().RevokeTree(child.Auth.ClientToken); err != nil {
		t.Fatal(err)
	}
	fresh, err := v.Client.Auth().Token().Create(&api.TokenCreateRequest{TTL: "1h", Policies: []string{"root"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(fresh.Auth.ClientToken), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sign(context.Background(), vaultRequest(t, id)); err != nil {
		t.Fatalf("after the token was revoked: %v", err)
	}

	// Vault stops: Unavailable, within the caller's deadline.
	v.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	start := time.Now()
	_, err = s.Sign(ctx, vaultRequest(t, id))
	cancel()
	wantKind(t, err, signer.KindUnavailable, "")
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("Sign took %v past a 2s deadline", d)
	}

	// Vault is back (a dev server comes back empty: configure it again).
	v.Start(t)
	v.ConfigurePKI(t, mount, root.Authority(), harness.VaultRole{})
	if err := os.WriteFile(tokenFile, []byte(harness.VaultRootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := s.Sign(context.Background(), vaultRequest(t, id))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after Vault came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
