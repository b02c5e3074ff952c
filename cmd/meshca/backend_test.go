package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/vaultauth"
	"github.com/spf13/pflag"
)

// TestKeyTypeSettingsValidate: the RSA profile and role, and the Vault
// re-login backoff.
func TestKeyTypeSettingsValidate(t *testing.T) {
	withVault := func(mutate func(*vaultFlags)) backendFlags {
		v := vaultFlags{addr: "http://v", mount: "pki", role: "mesh", tokenFile: "t", reloginBackoff: vaultauth.DefaultReloginBackoff}
		if mutate != nil {
			mutate(&v)
		}
		return backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k", opts: map[string]serveOptions{"vault": &v}}
	}
	withK8sCSR := func(mutate func(*backendFlags, *k8scsrFlags)) backendFlags {
		k := &k8scsrFlags{signerName: "example.com/meshca"}
		b := backendFlags{signer: "k8scsr", trustAnchors: "r", servingCert: "c", servingKey: "k", opts: map[string]serveOptions{"k8scsr": k}}
		if mutate != nil {
			mutate(&b, k)
		}
		return b
	}
	remote := func(profile, keProfile string) backendFlags {
		return backendFlags{signer: "cfssl", trustAnchors: "r", servingCert: "c", servingKey: "k",
			opts: map[string]serveOptions{"cfssl": &cfsslFlags{url: "http://x", profile: profile, keProfile: keProfile}}}
	}
	tests := []struct {
		name string
		b    backendFlags
		want string
	}{
		{"k8scsr", withK8sCSR(nil), ""},
		{"k8scsr with a CA state", withK8sCSR(func(b *backendFlags, _ *k8scsrFlags) { b.trustAnchors, b.hasState = "", true }), ""},
		{"k8scsr without a signer name", withK8sCSR(func(_ *backendFlags, k *k8scsrFlags) { k.signerName = "" }), "--k8scsr-signer-name (k8scsr.signerName) is required"},
		{"k8scsr without trust", withK8sCSR(func(b *backendFlags, _ *k8scsrFlags) { b.trustAnchors = "" }), "--trust-anchors (trustAnchors) (or a CA state) is required with the k8scsr signer"},
		{"k8scsr without a serving certificate", withK8sCSR(func(b *backendFlags, _ *k8scsrFlags) { b.servingKey = "" }), "--serving-cert-file (servingCertFile) and --serving-key-file (servingKeyFile) are required"},
		{"unknown signer", backendFlags{signer: "acme"}, `--signer (signer): "acme" is not one of ` + signerNames(func(*signerBackend) bool { return true })},
		{"vault with an RSA role", withVault(func(v *vaultFlags) { v.rsaRole = "mesh-rsa" }), ""},
		{"vault RSA role is the main role", withVault(func(v *vaultFlags) { v.rsaRole = "mesh" }), "--vault-rsa-role (vault.rsaRole) names the same role as --vault-role (vault.role)"},
		{"vault zero backoff", withVault(func(v *vaultFlags) { v.reloginBackoff = 0 }), ""},
		{"vault negative backoff", withVault(func(v *vaultFlags) { v.reloginBackoff = -time.Second }), "--vault-relogin-backoff (vault.reloginBackoff) must not be negative"},
		{"cfssl remote with an RSA profile", remote("mesh", "rsa"), ""},
		{"cfssl remote, RSA profile only", remote("", "rsa"), ""},
		{"cfssl RSA profile is the main profile", remote("mesh", "mesh"), "names the same profile as --cfssl-profile (cfssl.profile)"},
		{"cfssl in process with an RSA profile", backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{caCert: "c", caKey: "k", keProfile: "rsa"}}},
			"--cfssl-key-encipherment-profile (cfssl.keyEnciphermentProfile) applies to a remote cfssl only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.b.validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestKeyTypeSettingsReachBackends: flags and config file keys end up in
// the backends' configurations; a flag given on the command line wins.
func TestKeyTypeSettingsReachBackends(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := write("token", "s.token")
	file := write("meshca.yaml", configHeader+"cfssl:\n  url: http://cfssl:8888\n  profile: mesh\n  keyEnciphermentProfile: rsa\n"+
		"vault:\n  addr: http://vault:8200\n  role: mesh\n  rsaRole: mesh-rsa\n  reloginBackoff: 2m\n  tokenFile: "+token+"\n")
	type want struct {
		keProfile, rsaRole string
		backoff            time.Duration
	}
	tests := []struct {
		name  string
		file  string
		flags []string
		want  want
		err   string
	}{
		{name: "defaults", flags: []string{"--vault-addr", "http://v", "--vault-role", "mesh", "--vault-token-file", token},
			want: want{backoff: vaultauth.DefaultReloginBackoff}},
		{name: "flags", flags: []string{"--cfssl-url", "http://c", "--cfssl-key-encipherment-profile", "rsa", "--vault-addr", "http://v",
			"--vault-role", "mesh", "--vault-rsa-role", "mesh-rsa", "--vault-relogin-backoff", "90s", "--vault-token-file", token},
			want: want{keProfile: "rsa", rsaRole: "mesh-rsa", backoff: 90 * time.Second}},
		{name: "config file", file: file, want: want{keProfile: "rsa", rsaRole: "mesh-rsa", backoff: 2 * time.Minute}},
		{name: "flags win over the file", file: file,
			flags: []string{"--cfssl-key-encipherment-profile", "rsa4096", "--vault-rsa-role", "rsa-only", "--vault-relogin-backoff", "5s"},
			want:  want{keProfile: "rsa4096", rsaRole: "rsa-only", backoff: 5 * time.Second}},
		{name: "bad backoff in the file", file: write("bad.yaml", configHeader+"vault:\n  reloginBackoff: soon\n"), err: "--vault-relogin-backoff (vault.reloginBackoff)"},
		{name: "unknown key", file: write("typo.yaml", configHeader+"vault:\n  rsa_role: x\n"), err: `unknown field "vault.rsa_role"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b backendFlags
			fl := pflag.NewFlagSet("t", pflag.ContinueOnError)
			registerBackend(&b, fl)
			fl.String("config", "", "")
			if err := fl.Parse(tt.flags); err != nil {
				t.Fatal(err)
			}
			if tt.file != "" {
				_, err := resolveSettings(fl, []string{envName("config") + "=" + tt.file})
				if tt.err != "" {
					if err == nil || !strings.Contains(err.Error(), tt.err) {
						t.Fatalf("err = %v, want %q", err, tt.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			cf, vf := b.opts["cfssl"].(*cfsslFlags), b.opts["vault"].(*vaultFlags)
			rc, err := cf.remoteConfig(nil)
			if err != nil {
				t.Fatal(err)
			}
			vc, err := vf.config(slog.Default())
			if err != nil {
				t.Fatal(err)
			}
			got := want{keProfile: rc.KeyEnciphermentProfile, rsaRole: vc.KeyEnciphermentRole, backoff: vc.ReloginBackoff}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if vc.Role != vf.role || rc.Profile != cf.profile {
				t.Fatalf("role %q and profile %q, want the flags' %q and %q", vc.Role, rc.Profile, vf.role, cf.profile)
			}
		})
	}
}

// registerBackend registers every backend flag of serve on fl, as the
// groups of serve's help do.
func registerBackend(b *backendFlags, fl *pflag.FlagSet) {
	b.registerSigner(fl)
	b.registerServing(fl)
	for _, g := range b.groups() {
		g.register(fl)
	}
}

// podSigners are the backends that may sign pod certificates, as the
// messages list them: computed from the registered backends, so that a
// new backend changes no test's expected message.
func podSigners() string {
	return signerNames(func(b *signerBackend) bool { return b.noPodCertificates == "" })
}

func TestSignerNames(t *testing.T) {
	all := signerNames(func(*signerBackend) bool { return true })
	for _, b := range signerBackends {
		if strings.Count(all, b.name) != 1 {
			t.Errorf("signerNames = %q: backend %q is not named exactly once", all, b.name)
		}
	}
	if n := len(signerBackends); n > 1 && !strings.Contains(all, " or "+signerBackends[n-1].name) {
		t.Errorf("signerNames = %q, want the last name after \"or\"", all)
	}
	if got := signerNames(func(b *signerBackend) bool { return b.name == signerK8sCSR }); got != signerK8sCSR {
		t.Errorf("one name: %q, want %q", got, signerK8sCSR)
	}
	if got := signerNames(func(*signerBackend) bool { return false }); got != "" {
		t.Errorf("no name: %q", got)
	}
}
