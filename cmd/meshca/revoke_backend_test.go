package main

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
)

// recordingRevoker records what it is asked to revoke.
type recordingRevoker struct{ revoked []*x509.Certificate }

func (r *recordingRevoker) Revoke(_ context.Context, rv signer.Revocation) error {
	r.revoked = append(r.revoked, rv.Cert)
	return nil
}

func (*recordingRevoker) CRLs(context.Context) ([][]byte, error) { return nil, nil }

// TestRevokeBackend: meshca revoke --signer vault revokes in Vault by the
// certificate, skipping the CA certificates of a chain; what Vault or
// meshca cannot do is refused with the exit code and a message that says
// what to do instead.
func TestRevokeBackend(t *testing.T) {
	root := testca.NewRoot(t, "vault root", testca.Options{})
	leaf := root.Leaf(t, "spiffe://cluster.local/ns/a/sa/b", nil)
	chain := filepath.Join(t.TempDir(), "chain.pem")
	if err := os.WriteFile(chain, pemutil.EncodeCertificates(leaf, root.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	vaultArgs := []string{"--signer", "vault", "--vault-addr", "http://127.0.0.1:1", "--vault-token-file", token}
	tests := []struct {
		name    string
		args    []string
		code    int
		want    string
		revoked int
	}{
		{"by the certificate", append(vaultArgs, "--cert", chain, "--reason", "keyCompromise"), 0, "1 certificate(s) revoked in Vault (pki)", 1},
		{"dry run", append(vaultArgs, "--cert", chain, "--dry-run"), 0, "dry run: 1 certificate(s) would be revoked", 0},
		{"undo", append(vaultArgs, "--cert", chain, "--undo"), exitRefused, "Vault cannot take a revocation back", 0},
		{"by serial", append(vaultArgs, "--serial", "0a"), exitUsage, "keep no serials (no_store): give the certificate, --cert FILE", 0},
		{"a node", append(vaultArgs, "--node", "n1", "--since", "1h"), exitUsage, "revoke each of the node's certificates with --cert", 0},
		{"no certificate", vaultArgs, exitUsage, "--signer vault needs --cert", 0},
		{"the CA state", append(vaultArgs, "--cert", chain, "--state-dir", t.TempDir()), exitUsage, "--state-dir and --state-secret do not apply", 0},
		{"cfssl", []string{"--signer", "cfssl", "--serial", "0a"}, exitRefused, "signer cfssl cannot revoke certificates: cfssl keeps its own certificate database", 0},
		{"k8scsr", []string{"--signer", "k8scsr", "--serial", "0a"}, exitRefused, "signer k8scsr cannot revoke certificates", 0},
		{"cert with the built-in CA", []string{"--cert", chain, "--serial", "0a"}, exitUsage, "--cert revokes in Vault (--signer vault)", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recordingRevoker{}
			old := newVaultRevoker
			newVaultRevoker = func(vault.Config) (signer.Revoker, error) { return rec, nil }
			t.Cleanup(func() { newVaultRevoker = old })
			out, code := revokeCmd(t, "", append(tt.args, "--audit-log-file", filepath.Join(t.TempDir(), "audit"))...)
			if code != tt.code || !strings.Contains(out, tt.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tt.code, tt.want, out)
			}
			if tt.code == exitRefused && tt.name != "undo" && !strings.Contains(out, "docs/backends.md") {
				t.Errorf("the refusal does not name docs/backends.md:\n%s", out)
			}
			if len(rec.revoked) != tt.revoked || (tt.revoked == 1 && !rec.revoked[0].Equal(leaf)) {
				t.Fatalf("revoked %d certificates, want %d (the leaf only)", len(rec.revoked), tt.revoked)
			}
		})
	}
}
