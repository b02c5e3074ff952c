package signers

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/vaultauth"
)

// meshcaPolicy is the Vault policy docs/signers/vault.md gives meshca:
// signing with its two roles.
const meshcaPolicy = `path "pki/sign/mesh" { capabilities = ["create", "update"] }
path "pki/sign/mesh-rsa" { capabilities = ["create", "update"] }`

// appRoleLogin writes meshca's policy, enables AppRole with a role whose
// tokens carry roleSettings (token_ttl, ...), and returns meshca's AppRole
// login with its secret id in a file.
func appRoleLogin(t *testing.T, v *harness.Vault, roleSettings map[string]any) api.AuthMethod {
	t.Helper()
	roleID, secretFile := appRoleCredentials(t, v, roleSettings)
	auth, err := vaultauth.AppRole("", roleID, secretFile, "")
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

// appRoleCredentials is appRoleLogin's setup: it returns the role id and
// the file holding a secret id, as meshca's --vault-approle-* flags take
// them.
func appRoleCredentials(t *testing.T, v *harness.Vault, roleSettings map[string]any) (roleID, secretIDFile string) {
	t.Helper()
	ctx := context.Background()
	if err := v.Client.Sys().PutPolicyWithContext(ctx, "meshca", meshcaPolicy); err != nil {
		t.Fatal(err)
	}
	if err := v.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "approle", &api.EnableAuthOptions{Type: "approle"}); err != nil {
		t.Fatal(err)
	}
	settings := map[string]any{"token_policies": "meshca"}
	for k, val := range roleSettings {
		settings[k] = val
	}
	logical := v.Client.Logical()
	if _, err := logical.Write("auth/approle/role/meshca", settings); err != nil {
		t.Fatal(err)
	}
	rid, err := logical.Read("auth/approle/role/meshca/role-id")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := logical.Write("auth/approle/role/meshca/secret-id", nil)
	if err != nil {
		t.Fatal(err)
	}
	secretIDFile = filepath.Join(t.TempDir(), "secret-id")
	if err := os.WriteFile(secretIDFile, []byte(sid.Data["secret_id"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	return rid.Data["role_id"].(string), secretIDFile
}
