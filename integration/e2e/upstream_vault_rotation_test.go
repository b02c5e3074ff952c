package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// vaultBuild is the real Vault, built (or found in the cache) once for
// the tests that need it.
var vaultBuild struct {
	once sync.Once
	bin  string
	err  error
}

// startVault runs a real Vault dev server for t and writes its root
// token to a file for --vault-token-file.
func startVault(t *testing.T) (*harness.Vault, string) {
	t.Helper()
	vaultBuild.once.Do(func() { vaultBuild.bin, vaultBuild.err = harness.VaultBinary() })
	if vaultBuild.err != nil {
		t.Fatalf("the real Vault is required: %v", vaultBuild.err)
	}
	v := harness.StartVault(t, vaultBuild.bin)
	token := filepath.Join(t.TempDir(), "vault.token")
	if err := os.WriteFile(token, []byte(harness.VaultRootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return v, token
}

// TestVaultTransitRootRotation: a full root rotation (upstreamRotation)
// with --upstream vault-transit against the real Vault: serve makes the
// first root's Transit key, prepare the next one's, each non-exportable
// and without plaintext backup, and each root is the public key of the
// Transit key and version its Ref names; retire --destroy-root-key
// deletes the old key, which a Vault operator allowed.
func TestVaultTransitRootRotation(t *testing.T) {
	v, token := startVault(t)
	v.MountTransit(t, "transit")
	login := []string{"--vault-addr", v.Addr, "--vault-token-file", token, "--vault-transit-mount", "transit"}
	flags := append([]string{"--upstream", "vault-transit", "--intermediate-ttl", "10m"}, login...)
	var firstKey string
	r := upstreamRotation{name: "vault-transit", bin: bin, flags: flags,
		retire: append([]string{"--destroy-root-key", "--upstream", "vault-transit"}, login...),
		// A Vault operator allows the old root's key to be deleted.
		started: func(t *testing.T, first *keymgr.AuthorityRecord) {
			transitKeyHolds(t, v, first)
			firstKey, _, _ = strings.Cut(first.Upstream.Key, ":")
			if _, err := v.Client.Logical().WriteWithContext(context.Background(), "transit/keys/"+firstKey+"/config", map[string]any{"deletion_allowed": true}); err != nil {
				t.Fatal(err)
			}
		},
	}.run(t, "transit-rotation")
	transitKeyHolds(t, v, r.next)
	if s, err := v.Client.Logical().ReadWithContext(context.Background(), "transit/keys/"+firstKey); err != nil || s != nil {
		t.Fatalf("retire --destroy-root-key left the old root's key %s in Transit (%v)", firstKey, err)
	}
}

// transitKeyHolds: a's root is the public key of the Transit key and
// version its Ref names, and that key can leave Vault neither by export
// nor by backup.
func transitKeyHolds(t *testing.T, v *harness.Vault, a *keymgr.AuthorityRecord) {
	t.Helper()
	name, version, ok := strings.Cut(a.Upstream.Key, ":")
	if !ok {
		t.Fatalf("Ref %q names no key version", a.Upstream.Key)
	}
	s, err := v.Client.Logical().ReadWithContext(context.Background(), "transit/keys/"+name)
	if err != nil || s == nil {
		t.Fatalf("transit/keys/%s: %v", name, err)
	}
	if s.Data["exportable"] != false || s.Data["allow_plaintext_backup"] != false {
		t.Errorf("Transit key %s: exportable %v, allow_plaintext_backup %v; want neither", name, s.Data["exportable"], s.Data["allow_plaintext_backup"])
	}
	keys, _ := s.Data["keys"].(map[string]any)
	ver, _ := keys[version].(map[string]any)
	pub, _ := ver["public_key"].(string)
	block, _ := pem.Decode([]byte(pub))
	if block == nil {
		t.Fatalf("Transit key %s version %s has no public key in PEM: %q", name, version, pub)
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatalf("Transit key %s version %s: %v", name, version, err)
	}
	if !csr.SamePublicKey(k, a.Root.PublicKey) {
		t.Fatalf("root %q is not the key of Transit key %s version %s", a.Root.Subject, name, version)
	}
}

// TestVaultPKIRootRotation: a full root rotation (upstreamRotation) with
// --upstream vault-pki against the real Vault: serve makes the first
// root issuer, prepare a second, and activate and retire move meshca
// from one issuer to the other: the new issuer is the root of the
// bundle and signs the intermediate in service, and retire
// --destroy-root-key deletes the old one.
func TestVaultPKIRootRotation(t *testing.T) {
	v, token := startVault(t)
	v.MountPKI(t, "pki-mesh")
	login := []string{"--vault-addr", v.Addr, "--vault-token-file", token, "--vault-pki-mount", "pki-mesh"}
	r := upstreamRotation{name: "vault-pki", bin: bin, flags: append([]string{"--upstream", "vault-pki", "--intermediate-ttl", "10m"}, login...),
		retire: append([]string{"--destroy-root-key", "--upstream", "vault-pki"}, login...)}.run(t, "pki-rotation")
	issuers, err := v.Client.Logical().ListWithContext(context.Background(), "pki-mesh/issuers")
	if err != nil || issuers == nil || len(issuers.Data["keys"].([]any)) != 1 || issuers.Data["keys"].([]any)[0] != r.next.Upstream.Key {
		t.Fatalf("the mount's issuers are %v, want the new root's alone: retire --destroy-root-key deletes the old one (%v)", issuers, err)
	}
	for _, a := range []*keymgr.AuthorityRecord{r.next} {
		s, err := v.Client.Logical().ReadWithContext(context.Background(), "pki-mesh/issuer/"+a.Upstream.Key+"/json")
		if err != nil || s == nil {
			t.Fatalf("issuer %s: %v", a.Upstream.Key, err)
		}
		cert, _ := s.Data["certificate"].(string)
		issuer, err := pemutil.ParseCertificates([]byte(cert))
		if err != nil || len(issuer) != 1 || !issuer[0].Equal(a.Root) {
			t.Fatalf("Vault's issuer %s is not the root of authority %.16s (%v)", a.Upstream.Key, a.ID(), err)
		}
	}
	if err := r.next.Cert.CheckSignatureFrom(r.next.Root); err != nil || r.next.Cert.Issuer.String() != r.next.Root.Subject.String() {
		t.Fatalf("the intermediate in service is not signed by the new issuer: %v", err)
	}
}
