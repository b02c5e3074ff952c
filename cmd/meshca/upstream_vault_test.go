package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVaultUpstreamFlags: the Vault upstreams log in with the Vault
// backend's flags, checked before anything is read, and their own flags
// are keys of their own sections.
func TestVaultUpstreamFlags(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := "--state-dir=" + filepath.Join(dir, "state")
	login := []string{"--vault-addr=https://127.0.0.1:8200", "--vault-token-file=" + token}
	with := func(args ...string) []string { return append([]string{st}, args...) }
	tests := []struct {
		name string
		args []string
		want string // an error, or a line of --print-config
	}{
		{"pki", with(append(login, "--upstream=vault-pki", "--vault-pki-issuer=org-root")...), "vaultPKI:\n  issuer: \"org-root\" # flag"},
		{"pki's mount is the backend's", with(append(login, "--upstream=vault-pki", "--vault-pki-mount=pki-mesh")...), "pkiMount: \"pki-mesh\" # flag"},
		{"transit", with(append(login, "--upstream=vault-transit", "--vault-transit-key=org-root")...), "vaultTransit:\n  key: \"org-root\" # flag"},
		{"pki without an address", with("--upstream=vault-pki", "--vault-token-file="+token), "--vault-addr (vault.addr) is required with --upstream vault-pki"},
		{"transit without a login", with("--upstream=vault-transit", "--vault-addr=https://127.0.0.1:8200"), "log in to Vault in one way"},
		{"transit with two logins", with(append(login, "--upstream=vault-transit", "--vault-kubernetes-role=meshca")...), "log in to Vault in one way"},
		{"a Transit key named with a version", with(append(login, "--upstream=vault-transit", "--vault-transit-key=org-root:2")...),
			`--vault-transit-key (vaultTransit.key) "org-root:2" is not a Transit key's name`},
		{"an empty Transit mount", with(append(login, "--upstream=vault-transit", "--vault-transit-mount=")...), "--vault-transit-mount (vaultTransit.mount) must not be empty"},
		{"an issuer with a path", with(append(login, "--upstream=vault-pki", "--vault-pki-issuer=a/../b")...), "is not an issuer's name or ID"},
		{"with the Vault signer", with(append(login, "--upstream=vault-pki", "--signer=vault", "--vault-role=mesh", "--serving-cert-file=x", "--serving-key-file=y")...),
			"--upstream vault-pki renews the built-in CA's signing intermediate, and --signer vault signs elsewhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, nil)
			switch {
			case err != nil && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			case err == nil && !strings.Contains(out, tt.want):
				t.Fatalf("no %q in:\n%s", tt.want, out)
			}
		})
	}
}
