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
	cfg := filepath.Join(dir, "meshca.yaml")
	if err := os.WriteFile(cfg, []byte(configHeader+"upstream: vault-transit\nvault:\n  addr: https://127.0.0.1:8200\n  tokenFile: "+token+"\nvaultTransit:\n  key: org-root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // an error, or a line of --print-config
	}{
		{name: "login from the environment", args: with("--upstream=vault-pki", "--vault-token-file="+token),
			env: map[string]string{"MESHCA_VAULT_ADDR": "https://127.0.0.1:8200"}, want: `addr: "https://127.0.0.1:8200" # env MESHCA_VAULT_ADDR`},
		{name: "all from the config file", args: with("--config=" + cfg), want: "vaultTransit:\n  key: \"org-root\" # config"},
		{name: "pki", args: with(append(login, "--upstream=vault-pki", "--vault-pki-issuer=org-root")...), want: "vaultPKI:\n  issuer: \"org-root\" # flag"},
		{name: "pki's mount is the backend's", args: with(append(login, "--upstream=vault-pki", "--vault-pki-mount=pki-mesh")...), want: "pkiMount: \"pki-mesh\" # flag"},
		{name: "transit", args: with(append(login, "--upstream=vault-transit", "--vault-transit-key=org-root")...), want: "vaultTransit:\n  key: \"org-root\" # flag"},
		{name: "pki without an address", args: with("--upstream=vault-pki", "--vault-token-file="+token), want: "--vault-addr (vault.addr) is required with --upstream vault-pki"},
		{name: "transit without a login", args: with("--upstream=vault-transit", "--vault-addr=https://127.0.0.1:8200"), want: "log in to Vault in one way"},
		{name: "transit with two logins", args: with(append(login, "--upstream=vault-transit", "--vault-kubernetes-role=meshca")...), want: "log in to Vault in one way"},
		{name: "a Transit key named with a version", args: with(append(login, "--upstream=vault-transit", "--vault-transit-key=org-root:2")...),
			want: `--vault-transit-key (vaultTransit.key) "org-root:2" is not a Transit key's name`},
		{name: "an empty Transit mount", args: with(append(login, "--upstream=vault-transit", "--vault-transit-mount=")...), want: "--vault-transit-mount (vaultTransit.mount) must not be empty"},
		{name: "an issuer with a path", args: with(append(login, "--upstream=vault-pki", "--vault-pki-issuer=a/../b")...), want: "is not an issuer's name or ID"},
		{name: "with the Vault signer", args: with(append(login, "--upstream=vault-pki", "--signer=vault", "--vault-role=mesh", "--serving-cert-file=x", "--serving-key-file=y")...),
			want: "--upstream vault-pki renews the built-in CA's signing intermediate, and --signer vault signs elsewhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, tt.env)
			switch {
			case err != nil && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			case err == nil && !strings.Contains(out, tt.want):
				t.Fatalf("no %q in:\n%s", tt.want, out)
			}
		})
	}
}
