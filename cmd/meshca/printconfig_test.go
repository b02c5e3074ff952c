package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// runPrintConfig runs `serve --print-config` with args and the variables
// env set, and returns what it printed and its error.
func runPrintConfig(t *testing.T, args []string, env map[string]string) (string, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	cmd, _ := newServe()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(append([]string{"--print-config"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// line is the line of out that sets key (indented under its section).
func line(t *testing.T, out, key string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), key+": ") {
			return strings.TrimSpace(l)
		}
	}
	t.Fatalf("no %s in:\n%s", key, out)
	return ""
}

// TestPrintConfigSources: each setting is shown with where its value
// came from, and the printout is a ServeConfig file.
func TestPrintConfigSources(t *testing.T) {
	file := writeConfig(t, "defaultTTL: 12h\nvault:\n  role: from-file\n")
	out, err := runPrintConfig(t,
		[]string{"--config", file, "--state-dir", "/var/lib/meshca", "--trust-domain", "example.org"},
		map[string]string{"MESHCA_MAX_TTL": "48h", "CA_TRUSTED_NODE_ACCOUNTS": "istio-system/ztunnel,kube-system/proxy"})
	if err != nil {
		t.Fatalf("print-config: %v", err)
	}
	for key, want := range map[string]string{
		"apiVersion":          "apiVersion: meshca.io/v1alpha1",
		"kind":                "kind: ServeConfig",
		"trustDomain":         `trustDomain: "example.org" # flag`,
		"stateDir":            `stateDir: "/var/lib/meshca" # flag`,
		"defaultTTL":          `defaultTTL: "12h0m0s" # config`,
		"role":                `role: "from-file" # config`,
		"maxTTL":              `maxTTL: "48h0m0s" # env MESHCA_MAX_TTL`,
		"trustedNodeAccounts": `trustedNodeAccounts: ["istio-system/ztunnel","kube-system/proxy"] # env CA_TRUSTED_NODE_ACCOUNTS`,
		"certRenewal":         `certRenewal: true # default`,
		"tokenCacheSize":      `tokenCacheSize: 100000 # default`,
	} {
		if got := line(t, out, key); got != want {
			t.Errorf("%s: got %q, want %q", key, got, want)
		}
	}
	if !strings.Contains(out, "# --config: "+file+" (flag)") {
		t.Errorf("the config file is not named:\n%s", out)
	}
	for _, no := range []string{"printConfig:", "\nconfig:", "help:"} {
		if strings.Contains(out, no) {
			t.Errorf("printout sets %q, which is not a setting", no)
		}
	}
}

// TestPrintConfigRoundTrip: the printout, given back as --config alone,
// yields every setting it printed, and every one from the file.
func TestPrintConfigRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{name: "defaults", args: []string{"--state-dir", "/s"}},
		{name: "flags of every kind", args: []string{"--state-dir", "/s", "--trust-domain", "mesh.example",
			"--max-ttl", "100h", "--serving-dns-names", "a.svc,b.svc", "--remote-cluster", "east=/k/east,with-comma",
			"--cert-renewal=false", "--auto-rotate-prepare-at", "0.25", "--max-in-flight", "77",
			"--signer", "vault", "--vault-addr", "https://127.0.0.1:8200", "--vault-role", "mesh", "--vault-token-file", "/v", "--serving-cert-file", "/c", "--serving-key-file", "/k"}},
		{name: "environment", args: []string{"--state-dir", "/s"},
			env: map[string]string{"MESHCA_TOKEN_CACHE_SIZE": "5", "TRUST_DOMAIN": "env.example", "MESHCA_LOG_LEVEL": "debug"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, tt.env)
			if err != nil {
				t.Fatalf("print-config: %v", err)
			}
			cmd1, _ := newServe()
			if err := cmd1.Flags().Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if _, err := resolveSettings(cmd1.Flags(), environ(tt.env)); err != nil {
				t.Fatal(err)
			}
			file := writeFile(t, "printed.yaml", out)
			cmd2, _ := newServe()
			if err := cmd2.Flags().Parse([]string{"--config", file}); err != nil {
				t.Fatal(err)
			}
			s2, err := resolveSettings(cmd2.Flags(), nil)
			if err != nil {
				t.Fatalf("the printout does not read back: %v\n%s", err, out)
			}
			cmd1.Flags().VisitAll(func(f *pflag.Flag) {
				if notConfig[f.Name] {
					return
				}
				if got := cmd2.Flags().Lookup(f.Name).Value.String(); got != f.Value.String() {
					t.Errorf("--%s: read back %q, printed from %q", f.Name, got, f.Value.String())
				}
				if src := s2.source[f.Name]; src != sourceConfig {
					t.Errorf("--%s: read back from %s, not the file", f.Name, src)
				}
			})
		})
	}
}

func environ(env map[string]string) []string {
	out := []string{}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// TestPrintConfigRefusal: settings serve would refuse are printed, then
// refused with the same message serve gives, naming where the value came
// from; a value the audit redacts is marked, never printed.
func TestPrintConfigRefusal(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		wantOut string
	}{
		{name: "bad trust domain from the environment", args: []string{"--state-dir", "/s"},
			env:     map[string]string{"TRUST_DOMAIN": "Not A Domain"},
			wantErr: "--trust-domain from env TRUST_DOMAIN", wantOut: `trustDomain: "Not A Domain" # env TRUST_DOMAIN`},
		{name: "no CA state", args: []string{"--trust-domain", "example.org"},
			wantErr: "--state-dir", wantOut: `stateDir: "" # default`},
		{name: "bad log level", args: []string{"--state-dir", "/s", "--log-level", "loud"},
			wantErr: "--log-level", wantOut: `logLevel: "loud" # flag`},
		{name: "password in a URL", args: []string{"--state-dir", "/s", "--signer", "vault", "--vault-addr", "https://u:hunter2@127.0.0.1:8200", "--vault-role", "r", "--vault-token-file", "/v", "--serving-cert-file", "/c", "--serving-key-file", "/k"},
			wantOut: `addr: "https://u:xxxxx@127.0.0.1:8200" # flag, redacted: give it again`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, tt.env)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want one naming %q", err, tt.wantErr)
			}
			if !strings.Contains(out, tt.wantOut) {
				t.Errorf("printout lacks %q:\n%s", tt.wantOut, out)
			}
			if strings.Contains(out, "hunter2") {
				t.Errorf("printout shows a password")
			}
		})
	}
}
